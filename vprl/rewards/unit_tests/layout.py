"""The layout path of test-image generation for the shapes world ("shapes_layout").

As in LM-grounded diffusion (LMD+, [U] D.4.1; docs/references.md#test-images), a description first becomes a
*layout* (one box
per object, a background, the excluded things), then an image. Here the layout step is rules, not
an LLM, and the image step is the shapes world's own renderer instead of a layout-guided diffusion
model, so the pictures are what the shapes tools were built for.

The description's grammar (object mentions, relations, regions, orderings) is read by
`vprl/rewards/unit_tests/description_grammar.py`; this module places one instance per mentioned object
so every constraint holds, then draws them. Unspecified attributes are drawn from a generator
seeded by (description, seed), never equal to an excluded kind: so one description and seed always
give the same picture. A description the rules cannot lay out raises `LayoutError`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from PIL import Image

from vprl.data.boxes import intersection
from vprl.data.shapes.render import render
from vprl.data.shapes.scene import COLORS, SHAPES, Scene, ShapeObject, shape_box
from vprl.rewards.unit_tests.description_grammar import DescriptionSpec, parse_description
from vprl.rewards.unit_tests.protocols import register_generator

AXIS_GAP = 16  # pixels between centres that a relation or an ordering must clear (the programs' margin is 6)
REGION_MARGIN = 14  # a centre "in the left half" is at least this far from the middle
BOX_GAP = 4  # free pixels between boxes, so touching shapes of one colour never merge
RADIUS = {
    "small": (11, 14),
    "large": (23, 28),
}  # at 256 px: inside the world's classes, away from their border and from
# the smallest shapes, which the pixel tools misread most


class LayoutError(ValueError):
    """The description cannot be laid out (no room, contradictory constraints, nothing readable)."""


@dataclass(frozen=True)
class LayoutObject:
    phrase: str  # e.g. "large red circle"
    box: tuple[int, int, int, int]  # (x, y, width, height), top-left origin, as LMD's layouts
    shape: str
    color: str
    size: str
    center: tuple[int, int]  # where the shape was laid out (a polygon's box is not centred on it)
    radius: int
    angle: float


@dataclass(frozen=True)
class Layout:
    """What a description became: boxes with their objects, the background, what was excluded."""

    width: int
    height: int
    objects: tuple[LayoutObject, ...]
    background: str = "a grey background"
    negative: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Layout:
        objs = tuple(
            LayoutObject(**{**o, "box": tuple(o["box"]), "center": tuple(o["center"])}) for o in row["objects"]
        )
        return cls(row["width"], row["height"], objs, row.get("background", ""), tuple(row.get("negative", ())))


@dataclass
class _Instance:
    mention: int
    size: str
    color: str
    shape: str
    radius: int
    angle: float
    cx: int = 0
    cy: int = 0


def _instances(spec: DescriptionSpec, rng: np.random.Generator, scale: float) -> list[_Instance]:
    excluded = [m for m in spec.mentions if m.negated]
    out = []
    for i, m in enumerate(spec.mentions):
        if m.negated:
            continue
        for _ in range(m.count):
            options = [
                (s, c)
                for s in ([m.shape] if m.shape else SHAPES)
                for c in ([m.color] if m.color else COLORS)
                if m.shape and m.color or not any(e.matches(m.size, c, s) for e in excluded)
            ]
            if not options:
                raise LayoutError(f"every {m.color or ''} {m.shape or 'object'} is excluded")
            shape, color = options[int(rng.integers(len(options)))]
            size = m.size or ("small" if rng.random() < 0.5 else "large")
            if m.size is None and any(e.matches("small", color, shape) for e in excluded):
                size = "large"
            elif m.size is None and any(e.matches("large", color, shape) for e in excluded):
                size = "small"
            lo, hi = RADIUS[size]
            radius = max(3, int(round(rng.uniform(lo, hi) * scale)))
            angle = 0.0 if shape == "circle" else float(rng.uniform(0, 360))
            out.append(_Instance(i, size, color, shape, radius, angle))
    return out


def _pair_constraints(spec: DescriptionSpec, insts: list[_Instance]) -> list[tuple[int, str, int]]:
    """(a, axis, b): instance a must come before b on the axis (smaller pixel coordinate)."""
    by_mention: dict[int, list[int]] = {}
    for k, inst in enumerate(insts):
        by_mention.setdefault(inst.mention, []).append(k)
    out = []
    for a, axis, sign, b in spec.relations:
        first, second = (a, b) if sign > 0 else (b, a)
        out += [(i, axis, j) for i in by_mention.get(first, []) for j in by_mention.get(second, [])]
    for axis, sign, listed in spec.orders:
        chain = [k for mention in listed for k in by_mention.get(mention, [])]
        chain = chain if sign > 0 else chain[::-1]
        out += [(chain[t], axis, chain[t + 1]) for t in range(len(chain) - 1)]
    return out


def _depths(n: int, before: list[tuple[int, str, int]], axis: str) -> tuple[list[int], list[int]]:
    """Longest chain of instances that must come before (and after) each one on the axis."""
    edges = [(a, b) for a, ax, b in before if ax == axis]
    ahead, behind = [0] * n, [0] * n
    for _ in range(n + 1):
        changed = False
        for a, b in edges:
            if ahead[b] < ahead[a] + 1:
                ahead[b], changed = ahead[a] + 1, True
            if behind[a] < behind[b] + 1:
                behind[a], changed = behind[b] + 1, True
        if not changed:
            return ahead, behind
    raise LayoutError("the description's spatial constraints contradict each other")


def _place(spec: DescriptionSpec, insts: list[_Instance], rng, width: int, height: int, tries: int = 60) -> None:
    before = _pair_constraints(spec, insts)
    depth = {axis: _depths(len(insts), before, axis) for axis in ("x", "y")}
    size = {"x": width, "y": height}
    half = {"x": ("left", "right"), "y": ("top", "bottom")}
    for _attempt in range(tries):
        placed: list[int] = []
        for k, inst in enumerate(insts):
            regions = spec.mentions[inst.mention].regions
            bounds = {}
            for axis in ("x", "y"):
                lo, hi = inst.radius + 2, size[axis] - inst.radius - 3
                ahead, behind = depth[axis]
                lo, hi = max(lo, inst.radius + 2 + ahead[k] * AXIS_GAP), min(hi, hi - behind[k] * AXIS_GAP)
                if half[axis][0] in regions:
                    hi = min(hi, size[axis] // 2 - REGION_MARGIN)
                if half[axis][1] in regions:
                    lo = max(lo, size[axis] // 2 + REGION_MARGIN)
                for a, ax, b in before:
                    if ax == axis and b == k and a in placed:
                        lo = max(lo, _coord(insts[a], axis) + AXIS_GAP)
                    if ax == axis and a == k and b in placed:
                        hi = min(hi, _coord(insts[b], axis) - AXIS_GAP)
                bounds[axis] = (lo, hi)
            if any(lo > hi for lo, hi in bounds.values()):
                break
            for _spot in range(40):
                inst.cx = int(rng.integers(bounds["x"][0], bounds["x"][1] + 1))
                inst.cy = int(rng.integers(bounds["y"][0], bounds["y"][1] + 1))
                box = _box(inst)
                grown = (box[0] - BOX_GAP, box[1] - BOX_GAP, box[2] + BOX_GAP, box[3] + BOX_GAP)
                if all(intersection(grown, _box(insts[j])) is None for j in placed):
                    placed.append(k)
                    break
            else:
                break
        if len(placed) == len(insts):
            return
    raise LayoutError(f"no room for {len(insts)} objects under the description's constraints")


def _coord(inst: _Instance, axis: str) -> int:
    return inst.cx if axis == "x" else inst.cy


def _box(inst: _Instance) -> tuple[int, int, int, int]:
    return shape_box(inst.shape, inst.cx, inst.cy, inst.radius, inst.angle)


def description_rng(description: str, seed: int) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}\x00{description}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def layout_from_description(description: str, seed: int = 0, width: int = 256, height: int = 256) -> Layout:
    """The rules' layout of a description (deterministic per description and seed)."""
    spec = parse_description(description)
    if not spec.mentions and not re.search(r"\b(empty|nothing|blank|no objects?)\b", description.lower()):
        raise LayoutError(f"no object of the shapes world is mentioned in {description!r}")
    rng = description_rng(description, seed)
    insts = _instances(spec, rng, min(width, height) / 256)
    if len(insts) > 10:
        raise LayoutError(f"{len(insts)} objects do not fit a {width}x{height} canvas")
    _place(spec, insts, rng, width, height)
    objects = []
    for inst in insts:
        x0, y0, x1, y1 = _box(inst)
        objects.append(
            LayoutObject(
                f"{inst.size} {inst.color} {inst.shape}",
                (x0, y0, x1 - x0, y1 - y0),
                inst.shape,
                inst.color,
                inst.size,
                (inst.cx, inst.cy),
                inst.radius,
                inst.angle,
            )
        )
    negative = tuple(
        " ".join(w for w in (m.size, m.color, m.shape or "object") if w) for m in spec.mentions if m.negated
    )
    return Layout(width, height, tuple(objects), negative=negative)


def render_layout(layout: Layout, seed: int, description: str = "") -> Image.Image:
    """The layout drawn by the shapes world's renderer (its blur, gradient and grain included)."""
    rng = description_rng(description + "\x00render", seed)
    objects = []
    for i, o in enumerate(layout.objects):
        x, y, w, h = o.box
        cx, cy = o.center
        objects.append(
            ShapeObject(
                str(i),
                o.shape,
                o.color,
                o.size,
                cx,
                cy,
                o.radius,
                o.angle,
                float(rng.uniform(-6, 6)),
                x,
                y,
                x + w,
                y + h,
            )
        )
    scene = Scene("unit_test", layout.width, layout.height, tuple(objects), int(rng.integers(70, 190)))
    return Image.fromarray(render(scene, rng))


@register_generator("shapes_layout")
class ShapesLayoutGenerator:
    """Rule-based layout + shapes renderer: the shapes world's stand-in for LMD+ (`layout_path`)."""

    VERSION = 1  # bump when the rules or the renderer change what an image looks like

    def __init__(self, width: int = 256, height: int = 256):
        self.width, self.height = int(width), int(height)
        self.config_key = f"shapes_layout/v{self.VERSION}/{self.width}x{self.height}"

    def layout(self, description: str, seed: int) -> Layout:
        return layout_from_description(description, seed, self.width, self.height)

    def generate(self, description: str, seed: int) -> Image.Image:
        return render_layout(self.layout(description, seed), seed, description)
