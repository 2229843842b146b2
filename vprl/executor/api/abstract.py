"""Stanić et al.'s Abstract API: spatial routines that take left/right, top/bottom, near/far and
"middle" decisions out of the generated code and into tested code. Docstrings are shown to the LLM.
"""

from __future__ import annotations

from vprl.executor.api.helpers import distance
from vprl.executor.api.patch import ImagePatch


def _whole(patch: ImagePatch) -> ImagePatch:
    if not isinstance(patch, ImagePatch):
        raise TypeError(f"expected an ImagePatch, got {type(patch).__name__}")
    return ImagePatch(patch._source)


def _beside(patch: ImagePatch, crop_beside_bbox) -> ImagePatch:
    """The whole image's strip on one side of the patch: `crop_beside_bbox` is one of ImagePatch's
    `crop_{left_of,right_of,above,below}_bbox`."""
    return crop_beside_bbox(_whole(patch), *patch._box)


def get_patch_left_of(patch: ImagePatch) -> ImagePatch:
    """The region of the image to the left of the patch (the full image height).

    >>> # what is to the left of the horse?
    >>> horse = image_patch.find("horse")[0]
    >>> return get_patch_left_of(horse).simple_query("What is this?")
    """
    return _beside(patch, ImagePatch.crop_left_of_bbox)


def get_patch_right_of(patch: ImagePatch) -> ImagePatch:
    """The region of the image to the right of the patch (the full image height)."""
    return _beside(patch, ImagePatch.crop_right_of_bbox)


def get_patch_above_of(patch: ImagePatch) -> ImagePatch:
    """The region of the image above the patch (the full image width)."""
    return _beside(patch, ImagePatch.crop_above_bbox)


def get_patch_below_of(patch: ImagePatch) -> ImagePatch:
    """The region of the image below the patch (the full image width)."""
    return _beside(patch, ImagePatch.crop_below_bbox)


def get_patch_around_of(patch: ImagePatch) -> ImagePatch:
    """The region around the patch: the patch grown by its own size on every side, clipped to the image."""
    whole = _whole(patch)
    w, h = patch.width, patch.height
    return whole.crop(patch.left - w, patch.lower - h, patch.right + w, patch.upper + h)


def sort_patches_left_to_right(list_patches: list[ImagePatch]) -> list[ImagePatch]:
    """The patches sorted by horizontal centre, leftmost first.

    >>> # the second mug from the right
    >>> return sort_patches_left_to_right(image_patch.find("mug"))[-2]
    """
    return sorted(list_patches, key=lambda p: p.horizontal_center)


def sort_patches_bottom_to_top(list_patches: list[ImagePatch]) -> list[ImagePatch]:
    """The patches sorted by vertical centre, lowest first (so `[-1]` is the top one).

    >>> # the top shelf
    >>> return sort_patches_bottom_to_top(image_patch.find("shelf"))[-1]
    """
    return sorted(list_patches, key=lambda p: p.vertical_center)


def sort_patches_front_to_back(list_patches: list[ImagePatch]) -> list[ImagePatch]:
    """The patches sorted by depth, closest to the camera first (so `[-1]` is the farthest).

    >>> # the person in the back
    >>> return sort_patches_front_to_back(image_patch.find("person"))[-1]
    """
    return sorted(list_patches, key=lambda p: p.compute_depth())


def get_middle_patch(list_patches: list[ImagePatch]) -> ImagePatch:
    """The middle patch of the list in left-to-right order.

    >>> # the middle car
    >>> return get_middle_patch(image_patch.find("car"))
    """
    if not list_patches:
        raise ValueError("get_middle_patch() got an empty list")
    ordered = sort_patches_left_to_right(list_patches)
    return ordered[len(ordered) // 2]


def get_patch_closest_to_anchor_object(list_patches: list[ImagePatch], anchor_object: ImagePatch) -> ImagePatch:
    """The patch of the list closest to the anchor (the anchor itself is skipped if listed).

    >>> # the chair closest to the table
    >>> table = image_patch.find("table")[0]
    >>> return get_patch_closest_to_anchor_object(image_patch.find("chair"), table)
    """
    candidates = [p for p in list_patches if p != anchor_object]
    if not candidates:
        raise ValueError("get_patch_closest_to_anchor_object() got no candidate besides the anchor")
    return min(candidates, key=lambda p: distance(p, anchor_object))
