"""The image API that generated programs run against (ViperGPT's surface, Stanić et al.'s Abstract
API routines and ViUniT's helpers), reaching tools only through the bound `ToolClient`.
"""

from __future__ import annotations

import math
from typing import Any

from vprl.executor.api.abstract import (
    get_middle_patch,
    get_patch_above_of,
    get_patch_around_of,
    get_patch_below_of,
    get_patch_closest_to_anchor_object,
    get_patch_left_of,
    get_patch_right_of,
    sort_patches_bottom_to_top,
    sort_patches_front_to_back,
    sort_patches_left_to_right,
)
from vprl.executor.api.context import ToolClient, bind_client, current_client
from vprl.executor.api.helpers import (
    best_image_match,
    bool_to_yesno,
    coerce_to_numeric,
    distance,
)
from vprl.executor.api.language import llm_query, process_guesses, select_answer
from vprl.executor.api.patch import ImagePatch
from vprl.executor.api.source import SourceImage
from vprl.executor.api.video import Video, VideoSegment

API_OBJECTS: dict[str, Any] = {
    "ImagePatch": ImagePatch,
    "VideoSegment": VideoSegment,
    "best_image_match": best_image_match,
    "distance": distance,
    "bool_to_yesno": bool_to_yesno,
    "coerce_to_numeric": coerce_to_numeric,
    "llm_query": llm_query,
    "select_answer": select_answer,
    "process_guesses": process_guesses,
    "get_patch_left_of": get_patch_left_of,
    "get_patch_right_of": get_patch_right_of,
    "get_patch_above_of": get_patch_above_of,
    "get_patch_below_of": get_patch_below_of,
    "get_patch_around_of": get_patch_around_of,
    "sort_patches_left_to_right": sort_patches_left_to_right,
    "sort_patches_bottom_to_top": sort_patches_bottom_to_top,
    "sort_patches_front_to_back": sort_patches_front_to_back,
    "get_middle_patch": get_middle_patch,
    "get_patch_closest_to_anchor_object": get_patch_closest_to_anchor_object,
}


def program_globals() -> dict[str, Any]:
    """A fresh globals dict for one program: the API, `math`, `np`, and the typing names programs use.

    `np` is there because ViperGPT runs programs in a module that has imported numpy as np, and its
    NExT-QA prompt teaches programs to call `np.percentile` without an import."""
    import typing

    import numpy as np

    names: dict[str, Any] = {"__name__": "program", "math": math, "np": np}
    names.update({n: getattr(typing, n) for n in ("List", "Dict", "Tuple", "Union", "Optional", "Any")})
    names.update(API_OBJECTS)
    return names


__all__ = [
    "API_OBJECTS",
    "ImagePatch",
    "SourceImage",
    "ToolClient",
    "Video",
    "VideoSegment",
    "bind_client",
    "current_client",
    "program_globals",
    *sorted(n for n in API_OBJECTS if n not in ("ImagePatch", "VideoSegment")),
]
