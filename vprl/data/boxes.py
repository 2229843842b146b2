"""Box geometry for every layer: the two corner conventions, conversions between them, and overlap.

An API box is `(left, lower, right, upper)` in pixels with the origin at the bottom-left corner
(ViperGPT's convention, the one programs, `Example.box` and the rewards use). Detectors, scene
graphs and COCO files put the origin at the top-left: `(x0, y0, x1, y1)`, or `x, y, w, h`. Going
from one to the other flips the vertical axis, which is its own inverse. Overlap (intersection,
IoU, NMS) does not depend on the origin as long as both boxes share one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Box = tuple[int, int, int, int]  # (left, lower, right, upper), API convention: origin bottom-left
FloatBox = tuple[float, float, float, float]  # the same with sub-pixel borders (dataset and answer boxes)


def _flip(box: Sequence[float], height: float) -> tuple:
    a, b, c, d = box
    return (a, height - d, c, height - b)


def box_from_top_left(x0: float, y0: float, x1: float, y1: float, height: int) -> Box:
    """Convert a detector's top-left `(x0, y0, x1, y1)` box to the API's `(left, lower, right, upper)`."""
    return tuple(int(round(v)) for v in _flip((x0, y0, x1, y1), height))


def box_to_top_left(box: Box, height: int) -> tuple[int, int, int, int]:
    """Inverse of `box_from_top_left`: `(left, lower, right, upper)` to top-left `(x0, y0, x1, y1)`."""
    return _flip(box, height)


def box_from_xywh(x: float, y: float, w: float, h: float, height: float) -> FloatBox:
    """A dataset's top-left `x, y, w, h` (GQA objects, COCO `bbox`) as an API box, unrounded."""
    return _flip((x, y, x + w, y + h), height)


def check_box(box: Box, width: int, height: int) -> Box:
    """Return `box` as ints if it is a non-empty region inside a `width`x`height` image, else raise."""
    try:
        left, lower, right, upper = (int(v) for v in box)
    except (TypeError, ValueError):
        raise ValueError(f"box {box!r} must be four integers (left, lower, right, upper)") from None
    if not (0 <= left < right <= width and 0 <= lower < upper <= height):
        raise ValueError(
            f"box (left={left}, lower={lower}, right={right}, upper={upper}) is outside the "
            f"{width}x{height} image (need 0 <= left < right <= {width}, 0 <= lower < upper <= {height})"
        )
    return (left, lower, right, upper)


def intersection(a: Sequence[float], b: Sequence[float]) -> tuple | None:
    """The box two boxes share, or None when they share no area (touching edges share none)."""
    box = (max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]))
    return box if box[0] < box[2] and box[1] < box[3] else None


def intersection_area(a: Sequence[float], b: Sequence[float]) -> float:
    """Area of the overlap of two boxes; 0 when they do not overlap (ints stay ints)."""
    return max(min(a[2], b[2]) - max(a[0], b[0]), 0) * max(min(a[3], b[3]) - max(a[1], b[1]), 0)


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two boxes; 0.0 when the union is empty."""
    inter = intersection_area(a, b)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    if union <= 0:
        return 0.0
    # Rounding can push the ratio a hair past 1 for identical boxes with large coordinates.
    return float(min(1.0, max(0.0, inter / union)))


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> list[int]:
    """Greedy non-maximum suppression at IoU `threshold`; indices kept, best score first (no
    torchvision on CPU installs)."""
    order = list(np.argsort(-scores, kind="stable"))
    keep: list[int] = []
    while order:
        best = order.pop(0)
        keep.append(int(best))
        order = [j for j in order if iou(boxes[best], boxes[j]) <= threshold]
    return keep
