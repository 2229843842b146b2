"""One program card: what the page shows of one sampled (or evaluated) program, as compact JSON.

Run folders and evaluation folders are read differently (`run_data`, `eval_data`); both end here.
Boxes are converted to top-left pixels of the original image; the page scales them with the picture.
"""

from __future__ import annotations

import json
from typing import Any

from vprl.data.records import Example
from vprl.rewards.correctness import correctness
from vprl.train.view.images import Pictures
from vprl.train.view.traces import answer_box, call_marks, to_top_left

RIGHT_AT = 0.5  # a soft or IoU score at or above this is a right answer (evaluation's CORRECT_AT)
EXCEPTIONS = frozenset({"syntax_error", "runtime_error", "bad_return"})
MAX_TEXT = 400  # an answer or gold shown on a card


def show(value: Any) -> str:
    """An answer as a reader wants to see it: strings bare, anything else as JSON."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def gold_text(example: Example | None) -> str | None:
    if example is None:
        return None
    if example.task == "grounding" and example.box is not None:
        return "box " + json.dumps([round(v, 1) for v in example.box])
    if len(example.answers) == 1:
        return example.answers[0]
    return show(list(dict.fromkeys(example.answers)))


def right(example: Example | None, status: str, answer: Any, components: dict[str, Any] | None = None) -> bool | None:
    """Whether the answer is right: the run's correctness component where it has one, else scored
    against the example's gold; None when neither is known."""
    if components and "correctness" in components:
        value = components["correctness"]
        return value is not None and value >= RIGHT_AT
    if example is None:
        return None
    if status != "ok" or answer is None:
        return False
    try:
        return correctness(example, answer) >= RIGHT_AT
    except ValueError:  # an example without references (a label-free dataset): no verdict
        return None


def make_card(
    *,
    pictures: Pictures | None,
    example: Example | None,
    program: str,
    status: str,
    answer: Any,
    error: str | None,
    calls: list[dict[str, Any]],
    extra: dict[str, Any],
    components: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The card's JSON. `extra` carries what only one kind of folder has (step, reward, policy, ...)."""
    img = pictures.index(example.image) if pictures is not None and example is not None else None
    size = pictures.size(img) if pictures is not None else None
    height = size[1] if size else None
    example_id = extra.pop("example_id", example.id if example else "")
    card: dict[str, Any] = {
        "e": example_id,
        "st": status,
        "ans": None if answer is None else show(answer),
        "gold": gold_text(example),
        "right": right(example, status, answer, components),
        "err": error,
        "prog": program,
        "img": img,
        "noimg": pictures.problem(example.image) if pictures is not None and example is not None else None,
        "calls": [m.to_json() for m in call_marks(program, calls, size)],
    }
    if height is not None:
        card["abox"] = to_top_left(answer_box(answer), height)
        card["gbox"] = to_top_left(list(example.box), height) if example and example.box is not None else None
    card.update(extra)
    return card
