"""Which parts of the API each published prompt variant shows the LLM.

Programs always run against the full runtime; a variant only decides what the prompt lists
(ViperGPT App. B restricts the listing per benchmark; Stanić et al. add the spatial routines;
ViUniT uses a smaller class with the `crop_*_of_bbox` helpers).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ApiVariant:
    name: str
    classes: tuple[tuple[str, tuple[str, ...]], ...]  # (class name, members shown)
    functions: tuple[str, ...]
    guidelines: tuple[str, ...] = ()


_PATCH_VIPER = (
    "__init__",
    "find",
    "exists",
    "verify_property",
    "best_text_match",
    "simple_query",
    "compute_depth",
    "crop",
    "overlaps_with",
    "llm_query",
)
_VIPER_FUNCS = ("best_image_match", "distance", "bool_to_yesno", "llm_query", "coerce_to_numeric")
_ABSTRACT_FUNCS = (
    "get_patch_left_of",
    "get_patch_right_of",
    "get_patch_above_of",
    "get_patch_below_of",
    "get_patch_around_of",
    "sort_patches_left_to_right",
    "sort_patches_bottom_to_top",
    "sort_patches_front_to_back",
    "get_middle_patch",
    "get_patch_closest_to_anchor_object",
)
_BASE_GUIDELINE = "Use base Python (comparison, sorting) for basic logic, for left/right/up/down and for math."

VARIANTS: dict[str, ApiVariant] = {
    "vipergpt": ApiVariant("vipergpt", (("ImagePatch", _PATCH_VIPER),), _VIPER_FUNCS, (_BASE_GUIDELINE,)),
    "abstract": ApiVariant(
        "abstract",
        (("ImagePatch", _PATCH_VIPER),),
        _VIPER_FUNCS + _ABSTRACT_FUNCS,
        (
            _BASE_GUIDELINE,
            "Prefer the spatial routines (get_patch_left_of, sort_patches_left_to_right, ...) over "
            "comparing coordinates yourself.",
            "Coordinates: left and right are the horizontal borders, lower and "
            "upper the bottom and top borders; the origin is the bottom-left corner.",
        ),
    ),
    "viunit": ApiVariant(
        "viunit",
        (
            (
                "ImagePatch",
                (
                    "__init__",
                    "area",
                    "find",
                    "exists",
                    "verify_property",
                    "simple_query",
                    "crop_left_of_bbox",
                    "crop_right_of_bbox",
                    "crop_above_bbox",
                    "crop_below_bbox",
                ),
            ),
        ),
        ("best_image_match", "bool_to_yesno"),
        (_BASE_GUIDELINE,),
    ),
    "vipergpt_video": ApiVariant(
        "vipergpt_video",
        (
            ("VideoSegment", ("__init__", "frame_from_index", "frame_iterator", "trim", "select_answer")),
            ("ImagePatch", ("__init__", "find", "exists", "best_text_match", "simple_query")),
        ),
        ("best_image_match", "select_answer"),
        (_BASE_GUIDELINE,),
    ),
    "abstract_video": ApiVariant(
        "abstract_video",
        (
            (
                "VideoSegment",
                (
                    "__init__",
                    "trim",
                    "simple_query",
                    "caption_video",
                    "get_video_segment_of_event",
                    "get_video_segment_before_event",
                    "get_video_segment_after_event",
                ),
            ),
        ),
        ("select_answer",),
        (
            _BASE_GUIDELINE,
            "The program's input is a video, a question and the possible answers.",
            "Always start with `video_segment = VideoSegment(video)`.",
        ),
    ),
}


def get_variant(name: str) -> ApiVariant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown API variant {name!r}; valid: {sorted(VARIANTS)}") from None
