"""Imagined shapes-world scenes in words: the vocabulary the rule-based test writer thinks in.

`Ref` is a noun phrase of a query ("large red circle", "red object"), `Obj` one imagined object,
`Scene` a few objects with an optional ordering or relation, and `describe` turns a scene into the
description an image generator renders (in the grammar `description_grammar.py` reads). The
helpers draw objects that fit a phrase, near-misses that differ from it in one attribute, and
distractors that fit none of the phrases a question depends on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from vprl.data.shapes.scene import COLORS, SHAPES, SIZES

# The words as regex alternatives, for the query templates and the description grammar.
SIZE_PATTERN = "|".join(SIZES)
COLOR_PATTERN = "|".join(COLORS)
SHAPE_PATTERN = "|".join(SHAPES)
_NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five"}
_OPENERS = ("", "A grey background with ", "An image of ", "A picture showing ", "A plain grey scene with ")
_WHERE = {
    "left": ("on the left side of the image", "in the left half of the image"),
    "right": ("on the right side of the image", "in the right half of the image"),
    "top": ("in the top half of the image", "near the top of the image"),
    "bottom": ("in the bottom half of the image", "near the bottom of the image"),
}
_ORDER_WORDS = {"x": "From left to right", "y": "From top to bottom"}


class ImpossibleScene(ValueError):
    """No object fits: the query's phrases leave nothing to draw (e.g. a distractor that must be
    a circle and must not be a circle)."""


@dataclass(frozen=True)
class Ref:
    size: str | None = None
    color: str | None = None
    shape: str | None = None

    def matches(self, o: Obj) -> bool:
        return all(
            v is None or getattr(o, k) == v
            for k, v in (("size", self.size), ("color", self.color), ("shape", self.shape))
        )

    def specified(self) -> dict[str, str]:
        return {k: v for k, v in (("size", self.size), ("color", self.color), ("shape", self.shape)) if v is not None}


@dataclass(frozen=True)
class Obj:
    size: str
    color: str
    shape: str
    where: str | None = None  # left / right / top / bottom of the image

    @property
    def text(self) -> str:
        return f"{self.size} {self.color} {self.shape}"


@dataclass
class Scene:
    objects: list[Obj | None]
    order: str | None = None  # "x": listed left to right; "y": top to bottom
    relation: str | None = None  # the first object is <relation> the second
    absent: list[Ref] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.objects = [o for o in self.objects if o is not None]


def parse_ref(text: str) -> Ref:
    words = text.lower().split()
    size = next((w for w in words if w in SIZES), None)
    color = next((w for w in words if w in COLORS), None)
    shape = next((w for w in words if w in SHAPES), None)
    return Ref(size, color, shape)


def parse_plural(text: str) -> Ref:
    """ "red circles" / "circles" / "red objects" -> the kind counted."""
    return parse_ref(" ".join(w[:-1] if w.endswith("s") else w for w in text.lower().split()))


def _all_objects() -> list[Obj]:
    return [Obj(z, c, s) for z in SIZES for c in COLORS for s in SHAPES]


def _choose(rng: np.random.Generator, options: list[Obj], small: bool) -> Obj:
    if not options:
        raise ImpossibleScene("no object fits the constraints")
    if small and any(o.size == "small" for o in options):
        options = [o for o in options if o.size == "small"]
    return options[int(rng.integers(len(options)))]


def fill(rng: np.random.Generator, ref: Ref, avoid: Sequence[Ref] = (), small: bool = False) -> Obj:
    """An object that fits `ref` (unspecified attributes drawn) and fits none of `avoid`.
    `small` prefers the small size, to leave room in crowded scenes."""
    options = [o for o in _all_objects() if ref.matches(o) and not any(a.matches(o) for a in avoid)]
    return _choose(rng, options, small and ref.size is None)


def near_miss(
    rng: np.random.Generator, ref: Ref, avoid: Sequence[Ref] = (), small: bool = False, **fixed: str
) -> Obj | None:
    """An object that differs from `ref` in exactly one of its specified attributes (a red square
    for "red circle"), with `fixed` attributes set; None when the phrase leaves no near-miss."""
    spec = ref.specified()
    candidates = [
        o
        for o in _all_objects()
        if all(getattr(o, k) == v for k, v in fixed.items())
        and not ref.matches(o)
        and not any(a.matches(o) for a in avoid)
    ]
    close = [o for o in candidates if sum(getattr(o, k) != v for k, v in spec.items()) == 1]
    options = close or candidates
    return _choose(rng, options, small) if options else None


def distractors(
    rng: np.random.Generator, n: int | np.integer, avoid: Sequence[Ref] = (), small: bool = False
) -> list[Obj]:
    return [fill(rng, Ref(), avoid, small) for _ in range(int(n))]


def other(rng: np.random.Generator, vocab: Sequence[str], value: str) -> str:
    rest = [v for v in vocab if v != value]
    return rest[int(rng.integers(len(rest)))]


def _article(text: str) -> str:
    return ("an " if text[0] in "aeiou" else "a ") + text


def _listing(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _phrase(rng: np.random.Generator, o: Obj) -> str:
    text = _article(o.text)
    if o.where:
        options = _WHERE[o.where]
        text += " " + options[int(rng.integers(len(options)))]
    return text


def _grouped(objs: list[Obj]) -> list[str]:
    """Identical objects without a place are counted ("two small red circles"), as people write."""
    counts = Counter(o for o in objs if o.where is None)
    out, done = [], set()
    for o in objs:
        if o.where is None and counts[o] > 1:
            if o not in done:
                done.add(o)
                out.append(f"{_NUMBER_WORDS.get(counts[o], str(counts[o]))} {o.text}s")
        else:
            out.append(o)
    return out


def describe(rng: np.random.Generator, scene: Scene) -> str:
    objs = list(scene.objects)
    if not objs:
        text = "An empty grey background with no shapes"
    elif scene.order is not None:
        text = f"{_ORDER_WORDS[scene.order]}: " + _listing([_phrase(rng, o) for o in objs])
    elif scene.relation is not None and len(objs) >= 2:
        head = f"{_article(objs[0].text)} {scene.relation} {_article(objs[1].text)}"
        rest = [_phrase(rng, o) for o in objs[2:]]
        text = head + (", and " + _listing(rest) + " elsewhere" if rest else "")
        text = text[0].upper() + text[1:]
    else:
        order = [objs[int(i)] for i in rng.permutation(len(objs))]
        parts = [p if isinstance(p, str) else _phrase(rng, p) for p in _grouped(order)]
        opener = _OPENERS[int(rng.integers(len(_OPENERS)))]
        text = opener + _listing(parts)
        text = text[0].upper() + text[1:]
    for ref in scene.absent:
        words = " ".join(ref.specified().get(k, "") for k in ("size", "color", "shape") if k in ref.specified())
        text += f". There is no {words if ref.shape else words + ' object'}"
    return text + "."


__all__ = [
    "ImpossibleScene",
    "Obj",
    "Ref",
    "Scene",
    "describe",
    "distractors",
    "fill",
    "near_miss",
    "other",
    "parse_plural",
    "parse_ref",
    "replace",
]
