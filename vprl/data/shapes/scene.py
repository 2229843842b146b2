"""Scenes of the shapes world: coloured shapes on a noisy background, with exact ground truth.

A scene is a list of objects, each with a shape, a colour, a size class and a pixel box. Boxes
are integers in the TOP-LEFT convention of GQA scene graphs (`x0, y0` inclusive, `x1, y1`
exclusive), so the oracle backend and the gold programs see exactly the numbers the truth was
computed from. Colours are saturated and far apart in hue so that classical vision can separate
them; the background is grey, so saturation alone tells object from background.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vprl.data.boxes import intersection_area

SHAPES = ("circle", "square", "triangle", "star", "hexagon")
# Hue in degrees; names are words of `vprl.executor.tools.vocabulary.COLORS`.
COLOR_HUES = {
    "red": 0,
    "orange": 30,
    "yellow": 58,
    "green": 120,
    "cyan": 185,
    "blue": 232,
    "purple": 275,
    "magenta": 318,
}
COLORS = tuple(COLOR_HUES)
SIZES = ("small", "large")
# Circumradius ranges at 256 px; scaled with the image's shorter side.
RADIUS = {"small": (9, 14), "large": (21, 28)}
RELATIONS = ("to the left of", "to the right of", "above", "below", "near")


@dataclass(frozen=True)
class ShapeObject:
    id: str
    shape: str
    color: str
    size: str
    cx: int
    cy: int
    radius: int
    angle: float  # rotation in degrees (polygons only)
    hue_jitter: float  # degrees added to the colour's hue when drawn (imperfect paint)
    x0: int
    y0: int
    x1: int
    y1: int  # top-left box, x1/y1 exclusive

    @property
    def w(self) -> int:
        return self.x1 - self.x0

    @property
    def h(self) -> int:
        return self.y1 - self.y0

    @property
    def area(self) -> int:
        return self.w * self.h

    @property
    def box(self) -> tuple[int, int, int, int]:
        """`(x0, y0, x1, y1)`, top-left."""
        return (self.x0, self.y0, self.x1, self.y1)

    # Centres in the API's bottom-left convention, exactly as `ImagePatch` computes them.
    @property
    def horizontal_center(self) -> float:
        return (self.x0 + self.x1) / 2

    def vertical_center(self, height: int) -> float:
        return ((height - self.y1) + (height - self.y0)) / 2

    def phrase(self, *parts: str) -> str:
        """A noun phrase from the named parts in order, e.g. phrase("size", "color", "shape")."""
        values = {"size": self.size, "color": self.color, "shape": self.shape}
        words = [values[p] for p in parts]
        if "shape" not in parts:
            words.append("object")
        return " ".join(words)


@dataclass(frozen=True)
class Scene:
    image_id: str
    width: int
    height: int
    objects: tuple[ShapeObject, ...]
    background: int  # grey level of the background


def polygon(shape: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[int, int]]:
    """Integer vertices of a polygonal shape (top-left pixel coordinates)."""
    a0 = math.radians(angle)
    if shape == "square":
        pts = [(r, a0 + math.pi / 4 + k * math.pi / 2) for k in range(4)]
    elif shape == "triangle":
        pts = [(r, a0 - math.pi / 2 + k * 2 * math.pi / 3) for k in range(3)]
    elif shape == "hexagon":
        pts = [(r, a0 + k * math.pi / 3) for k in range(6)]
    elif shape == "star":
        pts = [(r if k % 2 == 0 else r * 0.45, a0 - math.pi / 2 + k * math.pi / 5) for k in range(10)]
    else:
        raise ValueError(f"{shape!r} is not a polygon shape")
    return [(int(round(cx + rad * math.cos(t))), int(round(cy + rad * math.sin(t)))) for rad, t in pts]


def shape_box(shape: str, cx: int, cy: int, r: int, angle: float) -> tuple[int, int, int, int]:
    """The pixel box a shape covers when drawn (PIL fills polygons and ellipses edge-inclusive)."""
    if shape == "circle":
        return (cx - r, cy - r, cx + r + 1, cy + r + 1)
    pts = polygon(shape, cx, cy, r, angle)
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    return (min(xs), min(ys), max(xs) + 1, max(ys) + 1)


def _placement_ok(box: tuple, others: list[ShapeObject], occlusion: bool, gap: int) -> bool:
    area = (box[2] - box[0]) * (box[3] - box[1])
    for o in others:
        if occlusion:
            # Little enough overlap that every object stays mostly visible and no box lies half
            # inside another (the oracle counts an object as in a region when half its box is).
            if intersection_area(box, o.box) > 0.2 * min(area, o.area):
                return False
        else:
            grown = (box[0] - gap, box[1] - gap, box[2] + gap, box[3] + gap)
            if intersection_area(grown, o.box) > 0:
                return False
    return True


def generate_scene(
    rng: np.random.Generator,
    image_id: str,
    width: int = 256,
    height: int = 256,
    min_objects: int = 1,
    max_objects: int = 8,
    occlusion_prob: float = 0.25,
    forced: tuple[tuple[str, str], ...] = (),
) -> Scene:
    """A random scene; objects that cannot be placed after a few tries are left out (so a scene
    may hold fewer than drawn, never overlapping more than the occlusion rule allows). `forced`
    (shape, colour) pairs are placed first, as objects "0", "1", ..."""
    scale = min(width, height) / 256
    n = max(int(rng.integers(min_objects, max_objects + 1)), len(forced))
    occlusion = bool(rng.random() < occlusion_prob)
    objects: list[ShapeObject] = []
    for i in range(n):
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        color = COLORS[int(rng.integers(len(COLORS)))]
        if i < len(forced):
            shape, color = forced[i]
        size = SIZES[int(rng.integers(len(SIZES)))]
        lo, hi = RADIUS[size]
        r = max(3, int(round(rng.uniform(lo, hi) * scale)))
        angle = float(rng.uniform(0, 360)) if shape != "circle" else 0.0
        jitter = float(rng.uniform(-6, 6))
        for _try in range(30):
            cx = int(rng.integers(r + 2, width - r - 2))
            cy = int(rng.integers(r + 2, height - r - 2))
            box = shape_box(shape, cx, cy, r, angle)
            if _placement_ok(box, objects, occlusion, gap=max(2, int(4 * scale))):
                objects.append(ShapeObject(str(len(objects)), shape, color, size, cx, cy, r, angle, jitter, *box))
                break
    if not objects:
        raise RuntimeError(f"could not place any object in a {width}x{height} scene")
    background = int(rng.integers(70, 190))
    return Scene(image_id, width, height, tuple(objects), background)


def relations(scene: Scene, near_frac: float = 0.2) -> dict[str, list[dict[str, str]]]:
    """GQA-style relations per object id: left/right by horizontal centre, above/below by vertical
    centre (ties give no relation), near when the boxes' gap is under `near_frac` of the width."""
    out: dict[str, list[dict[str, str]]] = {o.id: [] for o in scene.objects}
    for a in scene.objects:
        for b in scene.objects:
            if a is b:
                continue
            rels = []
            if a.horizontal_center < b.horizontal_center:
                rels.append("to the left of")
            elif a.horizontal_center > b.horizontal_center:
                rels.append("to the right of")
            if a.vertical_center(scene.height) > b.vertical_center(scene.height):
                rels.append("above")
            elif a.vertical_center(scene.height) < b.vertical_center(scene.height):
                rels.append("below")
            dx = max(b.x0 - a.x1, a.x0 - b.x1, 0)
            dy = max(b.y0 - a.y1, a.y0 - b.y1, 0)
            if math.hypot(dx, dy) < near_frac * scene.width:
                rels.append("near")
            out[a.id].extend({"name": r, "object": b.id} for r in rels)
    return out


def scene_to_gqa(scene: Scene) -> dict:
    """The scene in GQA's sceneGraphs format (name = shape, attributes = [colour, size])."""
    rels = relations(scene)
    return {
        "width": scene.width,
        "height": scene.height,
        "objects": {
            o.id: {
                "name": o.shape,
                "x": o.x0,
                "y": o.y0,
                "w": o.w,
                "h": o.h,
                "attributes": [o.color, o.size],
                "relations": rels[o.id],
            }
            for o in scene.objects
        },
    }
