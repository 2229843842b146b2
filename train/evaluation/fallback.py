"""The end-to-end answer a program falls back to when it fails (and the no-composition baseline).

VQA asks the question straight to `simple_query` (BLIP-2 in the papers' stacks); image-text
matching asks the matching tool (CLIP) whether the caption beats a neutral alternative; grounding
takes the detector's first box for the whole expression.
"""

from __future__ import annotations

from data.records import Example


def fallback_program(example: Example) -> str:
    if example.task == "itm":
        caption = example.meta.get("caption", example.query)
        return (
            "def execute_command(image) -> str:\n"
            f"    return ImagePatch(image).best_text_match([{caption!r}, 'something else']) == {caption!r} "
            "and 'yes' or 'no'\n"
        )
    if example.task == "grounding":
        return f"def execute_command(image) -> ImagePatch:\n    return ImagePatch(image).find({example.query!r})[0]\n"
    return f"def execute_command(image) -> str:\n    return ImagePatch(image).simple_query({example.query!r})\n"
