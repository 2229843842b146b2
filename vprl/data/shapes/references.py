"""Referring to shapes-world objects: phrases that pick out one object, relations and extremes
with their truth on the scene and their condition in a program, and the program template. Shared
by the question families, the matching captions and the referring expressions.
"""

from __future__ import annotations

import numpy as np

from vprl.data.shapes.scene import ShapeObject

MARGIN = 6  # pixels a deciding comparison must clear


def program(*lines: str) -> str:
    body = "\n".join("    " + line for line in ("image_patch = ImagePatch(image)", *lines))
    return f"def execute_command(image):\n{body}\n"


def pick(rng: np.random.Generator, items):
    items = list(items)
    return items[int(rng.integers(len(items)))] if items else None


def select(objs, color: str | None = None, shape: str | None = None, size: str | None = None) -> list[ShapeObject]:
    return [
        o
        for o in objs
        if (color is None or o.color == color)
        and (shape is None or o.shape == shape)
        and (size is None or o.size == size)
    ]


def unique_ref(obj: ShapeObject, objs, options: tuple[tuple[str, ...], ...]) -> str | None:
    """The first phrase from `options` (lists of parts) that picks out `obj` alone."""
    for parts in options:
        values = {p: getattr(obj, p) for p in parts}
        if select(objs, **values) == [obj]:
            return obj.phrase(*parts)
    return None


NO_COLOR = (("shape",), ("size", "shape"))
NO_SHAPE = (("color",), ("size", "color"))
ANY_REF = (("shape",), ("color", "shape"), ("size", "color", "shape"))

# relation word -> (truth on objects, program condition with `p` the candidate and `anchor`)
RELATIONS = {
    "to the left of": (
        lambda a, b, h: b.horizontal_center - a.horizontal_center,
        "p.horizontal_center < anchor.horizontal_center",
    ),
    "to the right of": (
        lambda a, b, h: a.horizontal_center - b.horizontal_center,
        "p.horizontal_center > anchor.horizontal_center",
    ),
    "above": (
        lambda a, b, h: a.vertical_center(h) - b.vertical_center(h),
        "p.vertical_center > anchor.vertical_center",
    ),
    "below": (
        lambda a, b, h: b.vertical_center(h) - a.vertical_center(h),
        "p.vertical_center < anchor.vertical_center",
    ),
}


def clears_margin(value: float) -> bool:
    return abs(value) >= MARGIN


def plural(parts: dict[str, str]) -> str:
    words = [parts[k] for k in ("color",) if k in parts]
    return " ".join([*words, parts["shape"] + "s" if "shape" in parts else "objects"])


# word -> (key on objects, larger wins?, program expression)
EXTREMES = {
    "leftmost": (lambda o, h: -o.horizontal_center, "min", "p.horizontal_center"),
    "rightmost": (lambda o, h: o.horizontal_center, "max", "p.horizontal_center"),
    "topmost": (lambda o, h: o.vertical_center(h), "max", "p.vertical_center"),
    "bottommost": (lambda o, h: -o.vertical_center(h), "min", "p.vertical_center"),
}
