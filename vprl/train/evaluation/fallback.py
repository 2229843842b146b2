"""The end-to-end answer a program falls back to when it fails (and the no-composition baseline).

VQA asks the question straight to `simple_query` (BLIP-2 in the papers' stacks); grounding takes
the detector's first box for the whole expression. Image-text matching asks the matching tool
(CLIP) whether the caption beats the other caption of its pair (Winoground's other caption,
SugarCREPE's positive or negative: `meta["other_caption"]`), the usual CLIP baseline on both; an
example without a pair is matched against a neutral alternative, which CLIP-like tools nearly
always lose to the caption (so it answers "yes").
"""

from __future__ import annotations

from vprl.data.records import Example


def fallback_program(example: Example) -> str:
    if example.task == "itm":
        caption = example.meta.get("caption", example.query)
        other = example.meta.get("other_caption", "something else")
        return (
            "def execute_command(image) -> str:\n"
            f"    return ImagePatch(image).best_text_match([{caption!r}, {other!r}]) == {caption!r} "
            "and 'yes' or 'no'\n"
        )
    if example.task == "grounding":
        return f"def execute_command(image) -> ImagePatch:\n    return ImagePatch(image).find({example.query!r})[0]\n"
    return f"def execute_command(image) -> str:\n    return ImagePatch(image).simple_query({example.query!r})\n"
