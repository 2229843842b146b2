"""Image-text matching in the shapes world: captions, their truth on a scene, their gold programs,
and the Winoground-style pairs and SugarCREPE-style hard negatives built from them.

A caption is one noun phrase ("a red circle"), two joined by "and", or two joined by a spatial
relation ("a red circle to the left of a blue square": some red circle is left of some blue
square, by box centres). Its truth is `None` when a deciding comparison is within `MARGIN`
pixels: such captions are never used, so every answer is clear from the picture.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from vprl.data.shapes.references import MARGIN, RELATIONS, pick, program, select
from vprl.data.shapes.scene import COLORS, SHAPES, Scene, generate_scene

OPPOSITE = {
    "to the left of": "to the right of",
    "to the right of": "to the left of",
    "above": "below",
    "below": "above",
}
SUGARCREPE_CATEGORIES = ("replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj", "add_att", "add_obj")


@dataclass(frozen=True)
class Phrase:
    shape: str
    color: str | None = None

    @property
    def text(self) -> str:
        return f"{self.color} {self.shape}" if self.color else self.shape


@dataclass(frozen=True)
class Caption:
    first: Phrase
    link: str | None = None  # "and", a relation of `RELATIONS`, or None for a single phrase
    second: Phrase | None = None

    @property
    def text(self) -> str:
        if self.second is None:
            return f"a {self.first.text}"
        return f"a {self.first.text} {self.link} a {self.second.text}"


def caption_truth(caption: Caption, scene: Scene) -> bool | None:
    firsts = select(scene.objects, color=caption.first.color, shape=caption.first.shape)
    if caption.second is None:
        return bool(firsts)
    seconds = select(scene.objects, color=caption.second.color, shape=caption.second.shape)
    if caption.link == "and":
        return bool(firsts) and bool(seconds)
    truth, _ = RELATIONS[caption.link]
    sides = [truth(a, b, scene.height) for a in firsts for b in seconds if a is not b]
    if any(abs(v) < MARGIN for v in sides):
        return None
    return any(v > 0 for v in sides)


def caption_program(caption: Caption) -> str:
    """Gold program answering "yes"/"no": does the image match the caption?"""
    p1 = caption.first.text
    if caption.second is None:
        return program(f'return bool_to_yesno(image_patch.exists("{p1}"))')
    p2 = caption.second.text
    if caption.link == "and":
        return program(f'return bool_to_yesno(image_patch.exists("{p1}") and image_patch.exists("{p2}"))')
    _, cond = RELATIONS[caption.link]
    return program(
        f'firsts = image_patch.find("{p1}")',
        f'seconds = image_patch.find("{p2}")',
        f"return bool_to_yesno(any({cond} for p in firsts for anchor in seconds))",
    )


def _scene_for(rng, image_id: str, want: list[tuple[Caption, bool]], forced, size: tuple[int, int], tries: int = 200):
    """A scene on which every caption has the wanted truth value (None if none is found)."""
    for _ in range(tries):
        scene = generate_scene(rng, image_id, *size, min_objects=2, max_objects=5, forced=forced)
        if all(caption_truth(c, scene) is w for c, w in want):
            return scene
    return None


# -- Winoground ----------------------------------------------------------------------------------
WINOGROUND_SWAPS = {
    "Object": lambda c1, s1, c2, s2: ((c2, s2), (c1, s1)),  # the two objects trade places
    "Adjective-Color": lambda c1, s1, c2, s2: ((c2, s1), (c1, s2)),  # the colours trade objects
    "Noun": lambda c1, s1, c2, s2: ((c1, s2), (c2, s1)),  # the shapes trade colours
}


@dataclass(frozen=True)
class WinogroundItem:
    id: int
    tag: str
    captions: tuple[Caption, Caption]
    scenes: tuple[Scene, Scene]


def winoground_item(rng: np.random.Generator, index: int, size: tuple[int, int]) -> WinogroundItem | None:
    tag = pick(rng, WINOGROUND_SWAPS)
    rel = pick(rng, OPPOSITE)
    c1, c2 = (COLORS[i] for i in rng.choice(len(COLORS), 2, replace=False))
    s1, s2 = (SHAPES[i] for i in rng.choice(len(SHAPES), 2, replace=False))
    (d1, t1), (d2, t2) = WINOGROUND_SWAPS[tag](c1, s1, c2, s2)
    cap0 = Caption(Phrase(s1, c1), rel, Phrase(s2, c2))
    cap1 = Caption(Phrase(t1, d1), rel, Phrase(t2, d2))
    scenes = []
    for i, (forced, (yes, no)) in enumerate(
        [(((s1, c1), (s2, c2)), (cap0, cap1)), (((t1, d1), (t2, d2)), (cap1, cap0))]
    ):
        scene = _scene_for(rng, f"wino_{index}_img_{i}", [(yes, True), (no, False)], forced, size)
        if scene is None:
            return None
        scenes.append(scene)
    return WinogroundItem(index, tag, (cap0, cap1), (scenes[0], scenes[1]))


# -- SugarCREPE ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SugarCrepeItem:
    category: str
    index: int
    positive: Caption
    negative: Caption
    scene: Scene


def _absent(scene: Scene, rng, color: str | None, shape: str | None, vary: str) -> str:
    """A colour (or shape) that, put in place of the varied slot, names nothing in the scene."""
    vocab = COLORS if vary == "color" else SHAPES
    free = [
        v
        for v in vocab
        if not select(scene.objects, **{"color": color, "shape": shape, vary: v})
        and v != (color if vary == "color" else shape)
    ]
    return pick(rng, free) if free else ""


def sugarcrepe_item(rng: np.random.Generator, category: str, index: int, size: tuple[int, int]):
    scene = generate_scene(rng, f"sugarcrepe_{category}_{index}", *size, min_objects=2, max_objects=6)
    a, b = (scene.objects[i] for i in rng.choice(len(scene.objects), 2, replace=False))
    pa, pb = Phrase(a.shape, a.color), Phrase(b.shape, b.color)
    rel = pick(rng, OPPOSITE)
    pos = Caption(pa, "and", pb)
    if category == "replace_att":
        neg = replace(pos, first=Phrase(a.shape, _absent(scene, rng, a.color, a.shape, "color")))
    elif category == "replace_obj":
        neg = replace(pos, first=Phrase(_absent(scene, rng, a.color, a.shape, "shape"), a.color))
    elif category == "replace_rel":
        pos = Caption(pa, rel, pb)
        neg = Caption(pa, OPPOSITE[rel], pb)
    elif category == "swap_att":
        neg = Caption(Phrase(a.shape, b.color), "and", Phrase(b.shape, a.color))
    elif category == "swap_obj":
        pos = Caption(pa, rel, pb)
        neg = Caption(Phrase(b.shape, a.color), rel, Phrase(a.shape, b.color))
    elif category == "add_att":
        pos = Caption(Phrase(a.shape), "and", pb)
        neg = Caption(Phrase(a.shape, _absent(scene, rng, None, a.shape, "color")), "and", pb)
    elif category == "add_obj":
        other = pick(rng, [(c, s) for c in COLORS for s in SHAPES if not select(scene.objects, color=c, shape=s)])
        pos = Caption(pa)
        neg = Caption(pa, "and", Phrase(other[1], other[0]))
    else:
        raise ValueError(f"unknown SugarCREPE category {category!r}; valid: {SUGARCREPE_CATEGORIES}")
    if "" in (neg.first.shape, neg.first.color) or pos.text == neg.text:
        return None
    if caption_truth(pos, scene) is not True or caption_truth(neg, scene) is not False:
        return None
    return SugarCrepeItem(category, index, pos, neg, scene)
