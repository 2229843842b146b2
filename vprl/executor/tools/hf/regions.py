"""Regions of calls: cropping in the API convention, grouping calls that share a region, batching.

A call's `box` is `(left, lower, right, upper)` with the origin at the bottom-left; the crop of an
(H, W, 3) array is `pixels[H-upper:H-lower, left:right]`. Detections come back in the crop's
top-left pixels and are shifted by the crop's top-left corner `(left, H-upper)` into the whole
image's top-left pixels.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vprl.data.boxes import Box, check_box
from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.errors import ToolError
from vprl.executor.tools.images import ImageStore


@dataclass(frozen=True)
class Region:
    """An image region in the API convention, with the whole image's size."""

    image: str
    box: Box  # (left, lower, right, upper), bottom-left origin
    width: int  # of the whole image
    height: int

    @property
    def top_left_offset(self) -> tuple[int, int]:
        """The crop's top-left corner in the whole image's top-left pixels."""
        left, _, _, upper = self.box
        return left, self.height - upper

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the crop."""
        left, lower, right, upper = self.box
        return right - left, upper - lower


def region_of(call: ToolCall, images: ImageStore) -> Region:
    if call.image is None:
        raise ToolError(f"{call.tool} needs an image")
    info = images.get(call.image)
    box = (0, 0, info.width, info.height) if call.box is None else call.box
    try:
        box = check_box(box, info.width, info.height)
    except ValueError as exc:
        raise ToolError(str(exc)) from None
    return Region(call.image, box, info.width, info.height)


def crop(pixels: np.ndarray, region: Region) -> np.ndarray:
    left, lower, right, upper = region.box
    height = pixels.shape[0]
    return pixels[height - upper : height - lower, left:right]


def crop_pil(images: ImageStore, region: Region):
    """The region as a PIL RGB image (what the HF processors take)."""
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(crop(images.get(region.image).load_pixels(), region)))


def group_by_region(calls: Sequence[ToolCall], images: ImageStore) -> dict[Region, list[int]]:
    """Indices of the calls per distinct region, in first-seen order (so a region is encoded once)."""
    groups: dict[Region, list[int]] = {}
    for i, call in enumerate(calls):
        groups.setdefault(region_of(call, images), []).append(i)
    return groups


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    if size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {size}")
    for start in range(0, len(items), size):
        yield items[start : start + size]


def dedupe(keys: Sequence[Any]) -> tuple[list[Any], list[int]]:
    """Distinct keys in first-seen order, and for each input the index of its distinct key."""
    index: dict[Any, int] = {}
    where = [index.setdefault(key, len(index)) for key in keys]
    return list(index), where


def crop_boxes_to_image(boxes: np.ndarray, region: Region) -> np.ndarray:
    """Boxes `(x0, y0, x1, y1)` in the crop's top-left pixels -> the whole image's top-left pixels.

    Boxes are clipped to the crop first (detectors may predict past the border), so the result
    always lies inside the region the program asked about.
    """
    width, height = region.size
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4).copy()
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, width)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, height)
    dx, dy = region.top_left_offset
    boxes[:, [0, 2]] += dx
    boxes[:, [1, 3]] += dy
    return boxes
