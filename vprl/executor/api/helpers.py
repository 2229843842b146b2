"""Module-level functions of the image API (ViperGPT's helpers). Docstrings are shown to the LLM."""

from __future__ import annotations

import re

import numpy as np

from vprl.data.boxes import iou
from vprl.executor.api.errors import expect_str_list
from vprl.executor.api.patch import ImagePatch


def best_image_match(list_patches: list[ImagePatch], content: list[str], return_index: bool = False):
    """Return the patch that best matches the content (a list of phrases, all of which should
    match), or its index when `return_index` is True. Returns None for an empty list.

    >>> # the kid wearing a pink scarf and blue pants
    >>> kids = image_patch.find("kid")
    >>> return best_image_match(kids, ["pink scarf", "blue pants"])
    """
    texts = expect_str_list("best_image_match", "content", [content] if isinstance(content, str) else content)
    if not list_patches:
        return None
    if not all(isinstance(p, ImagePatch) for p in list_patches):
        raise TypeError("best_image_match() expects a list of ImagePatch")
    # Every phrase should hold, so a patch's score is the mean over phrases.
    scores = [float(np.mean(p._tool("itm", texts=texts))) for p in list_patches]
    index = int(np.argmax(scores))
    return index if return_index else list_patches[index]


def distance(patch_a: ImagePatch | float, patch_b: ImagePatch | float) -> float:
    """Pixel distance between the edges of two patches; when they overlap, minus their IoU
    (so overlapping patches are always "closer" than separate ones). Given two numbers (such as
    two `horizontal_center`s), their absolute difference.

    >>> # the cup closest to the laptop
    >>> laptop = image_patch.find("laptop")[0]
    >>> cups = image_patch.find("cup")
    >>> return min(cups, key=lambda cup: distance(cup, laptop))
    """
    if _is_number(patch_a) and _is_number(patch_b):
        # ViperGPT's own `distance` takes numbers too, and its RefCOCO prompt compares centres with it.
        return float(abs(patch_a - patch_b))
    if not isinstance(patch_a, ImagePatch) or not isinstance(patch_b, ImagePatch):
        raise TypeError(
            "distance() expects two ImagePatch or two numbers, "
            f"got {type(patch_a).__name__} and {type(patch_b).__name__}"
        )
    dx = max(patch_b.left - patch_a.right, patch_a.left - patch_b.right, 0)
    dy = max(patch_b.lower - patch_a.upper, patch_a.lower - patch_b.upper, 0)
    if dx == 0 and dy == 0:
        overlap = iou(patch_a._box, patch_b._box)
        return -overlap if overlap > 0 else 0.0  # touching patches are at 0.0, not -0.0
    return float(np.hypot(dx, dy))


def _is_number(value) -> bool:
    # numpy scalars count (a depth or a mean often is one); bools do not: they are answers, not positions
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def bool_to_yesno(bool_answer: bool) -> str:
    """ "yes" if the value is true, "no" otherwise.

    >>> return bool_to_yesno(image_patch.exists("cat"))
    """
    return "yes" if bool_answer else "no"


def coerce_to_numeric(string, no_string: bool = False):
    """Turn a string such as "2", "about 3.5 kg" or "1,000" into a number (int when whole);
    returns the string unchanged (or None when `no_string`) if it holds no number.

    >>> # how many more apples than oranges?
    >>> return str(coerce_to_numeric(apples.simple_query("How many?")) - 2)
    """
    if isinstance(string, (int, float)) and not isinstance(string, bool):
        return string
    text = str(string).replace(",", "")
    match = re.search(r"-?\d+(?:\.\d+)?", text)
    if match is None:
        words = {
            "zero": 0,
            "one": 1,
            "two": 2,
            "three": 3,
            "four": 4,
            "five": 5,
            "six": 6,
            "seven": 7,
            "eight": 8,
            "nine": 9,
            "ten": 10,
        }
        for word in re.findall(r"[a-z]+", text.lower()):
            if word in words:
                return words[word]
        return None if no_string else string
    value = float(match.group())
    return int(value) if value.is_integer() else value
