"""Dataset-aware correctness of a program's answer against an `Example`'s references: the training
reward's match.

This is deliberately more lenient than the official metrics: answer and reference are both put
through the VQA normalisation, so "a metal", "Silver" and "no." count as right, which gives the
policy a denser signal for an answer it got right in substance. Evaluation never reports it as a
paper's metric: `vprl/train/evaluation/official.py` computes each dataset's official metric the way its
official script does (GQA compares strings as they are, on balanced questions only; SugarCREPE
counts an entry right when the positive caption scores above the negative), and the report shows
this match beside it as `normalised_match` (docs/references.md#metrics-official-and-reported).

`correctness(example, answer)` returns a score in [0, 1]. Dispatch:

- task `vqa`, dataset VQAv2 or OK-VQA (`vqav2`, `okvqa`; names compare lower-cased with
  non-alphanumerics dropped, so "OK-VQA" and "vqa_v2" count): VQA soft accuracy over the annotator
  answers. With fewer than 4 references no answer could reach 1 under that formula (a
  leave-one-out subset then holds at most 2 matches), so such examples fall back to exact match
  (documented choice: a single-reference "VQAv2" row must not cap the reward at 0).
- task `vqa` for every other dataset (GQA, the shapes world, anything unknown) and task
  `video_qa` (NExT-QA-style multiple choice: the chosen option text must equal the reference):
  exact match after the official normalisation against any reference.
- task `itm` (Winoground, SugarCREPE, shapes matching): the answer folded to yes/no must equal the
  reference; anything that does not fold to yes/no scores 0.
- task `grounding` (RefCOCO family): continuous IoU with `example.box`, the denser signal for RL;
  `grounding_scores` also gives accuracy at IoU >= 0.5, the standard REC accuracy.

Answers are plain JSON from the executor: str, number, bool, None, list, or a box
`{"box": [left, lower, right, upper]}` (pixels, origin bottom-left; extra keys such as "category"
are allowed). An answer of the wrong kind for the task scores 0; a malformed *example* (no
references, a non-yes/no ITM reference, a grounding row without a box) raises ValueError, because
that is our data's fault, not the program's.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from typing import Any

from vprl.data import boxes
from vprl.data.records import Example
from vprl.rewards.answer_normalization import answer_to_text, normalize_answer

__all__ = [
    "SOFT_ACCURACY_DATASETS",
    "answer_kind_error",
    "correctness",
    "exact_match",
    "grounding_scores",
    "iou",
    "parse_box",
    "vqa_soft_accuracy",
    "yes_no",
]

SOFT_ACCURACY_DATASETS: frozenset[str] = frozenset({"vqav2", "okvqa"})
# Below this many references the soft-accuracy formula cannot reach 1 (see module docstring).
_MIN_SOFT_REFERENCES = 4
IOU_THRESHOLD = 0.5


def _dataset_key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _matches(answer: Any, answers: Sequence[str], metric: str) -> list[bool] | None:
    """Per reference, whether it equals the answer after normalisation; None when the answer is no text."""
    if not answers:
        raise ValueError(f"{metric} needs at least one reference answer")
    text = answer_to_text(answer)
    if text is None:
        return None
    predicted = normalize_answer(text)
    return [normalize_answer(ref) == predicted for ref in answers]


def vqa_soft_accuracy(answer: Any, answers: Sequence[str]) -> float:
    """VQAv2 accuracy: the mean over leave-one-out subsets of min(#matches among the others / 3, 1).

    With the usual ten annotator answers this is the official metric: 3 matching annotators give
    0.9, 2 give 0.6, 1 gives 0.3, 4 or more give 1. With n < 10 references the same formula runs
    over the n subsets of n - 1, so the best reachable score is min((n - 1) / 3, 1). Both sides are
    normalised here; the official script relies on the released annotations being normalised
    already, and normalising them again leaves them unchanged.
    """
    matches = _matches(answer, answers, "vqa_soft_accuracy")
    if matches is None:
        return 0.0
    total = sum(matches)
    # Leaving out a matching reference removes one match from the others; leaving out another doesn't.
    return sum(min((total - m) / 3.0, 1.0) for m in matches) / len(matches)


def exact_match(answer: Any, answers: Sequence[str]) -> float:
    """1.0 when the normalised answer equals any normalised reference (GQA's metric), else 0.0."""
    matches = _matches(answer, answers, "exact_match")
    return 0.0 if matches is None else float(any(matches))


def yes_no(answer: Any) -> str | None:
    """Fold an answer to "yes" / "no" ignoring case, surrounding space and punctuation; else None.

    `True`/`False` fold to yes/no; numbers do not (1 is not an answer to a yes/no question).
    """
    if isinstance(answer, bool):
        return "yes" if answer else "no"
    if not isinstance(answer, str):
        return None
    folded = answer.strip().lower().strip(string.punctuation + string.whitespace)
    return folded if folded in ("yes", "no") else None


def _itm_accuracy(example: Example, answer: Any) -> float:
    if not example.answers:
        raise ValueError(f"Example {example.id!r} ({example.dataset}): ITM example has no reference answer")
    references = set()
    for ref in example.answers:
        folded = yes_no(ref)
        if folded is None:
            raise ValueError(f"Example {example.id!r} ({example.dataset}): ITM reference {ref!r} is not yes/no")
        references.add(folded)
    return float(yes_no(answer) in references)


def _check_box(box: Sequence[Any], what: str) -> boxes.FloatBox:
    if isinstance(box, str | bytes) or not isinstance(box, Sequence) or len(box) != 4:
        raise ValueError(f"{what}: a box is 4 numbers (left, lower, right, upper), got {box!r}")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in box):
        raise ValueError(f"{what}: box coordinates must be numbers, got {box!r}")
    left, lower, right, upper = (float(v) for v in box)
    if not all(math.isfinite(v) for v in (left, lower, right, upper)):
        raise ValueError(f"{what}: box coordinates must be finite, got {box!r}")
    if left > right or lower > upper:
        raise ValueError(f"{what}: box needs left <= right and lower <= upper, got {box!r}")
    return left, lower, right, upper


def iou(box_a: Sequence[float], box_b: Sequence[float]) -> float:
    """Intersection over union of two (left, lower, right, upper) boxes; 0.0 when the union is empty.

    The formula is the same for bottom-left and top-left origins, as long as both boxes share one.
    Malformed boxes (wrong length, non-finite, inverted) raise ValueError: answers and examples
    reach this unchecked, unlike the boxes `vprl.data.boxes.iou` gets from the tools.
    """
    return boxes.iou(_check_box(box_a, "iou box_a"), _check_box(box_b, "iou box_b"))


def parse_box(answer: Any) -> boxes.FloatBox | None:
    """The box in a program answer `{"box": [left, lower, right, upper], ...}`, or None if it has none.

    A malformed box (wrong length, non-numbers, non-finite, inverted) is the program's fault, so it
    yields None (scored 0) rather than an error.
    """
    if not isinstance(answer, dict) or "box" not in answer:
        return None
    try:
        return _check_box(answer["box"], "answer")
    except ValueError:
        return None


def grounding_scores(example: Example, answer: Any) -> dict[str, float]:
    """`{"iou": IoU with example.box, "acc50": 1.0 if IoU >= 0.5 else 0.0}`; both 0 for a non-box answer."""
    if example.box is None:
        raise ValueError(f"Example {example.id!r} ({example.dataset}): grounding example has no box")
    predicted = parse_box(answer)
    if predicted is None:
        return {"iou": 0.0, "acc50": 0.0}
    overlap = iou(predicted, _check_box(example.box, f"Example {example.id!r} box"))
    return {"iou": overlap, "acc50": float(overlap >= IOU_THRESHOLD)}


_KINDS = {
    "grounding": "a box (an ImagePatch)",
    "itm": "yes or no (or a bool)",
    "vqa": "text or a number",
    "video_qa": "text or a number",
}


def answer_kind_error(task: str, answer: Any) -> str | None:
    """Why `answer` is not an answer to a `task` question at all, or None when it is one.

    A grounding program that returns "yes", or a yes/no program that returns a list of patches, has
    not answered: evaluation counts it as a `bad_return` (an exception, so the fallback may answer),
    where `correctness` would only score it 0 like any wrong answer of the right kind.
    """
    if task == "grounding":
        fits = parse_box(answer) is not None
    elif task == "itm":
        fits = yes_no(answer) is not None
    elif task in ("vqa", "video_qa"):
        fits = answer_to_text(answer) is not None
    else:
        raise ValueError(f"no answer kind for task {task!r}")
    if fits:
        return None
    shown = repr(answer)
    return f"a {task} program must return {_KINDS[task]}; it returned {shown[:80]}{'...' if len(shown) > 80 else ''}"


def correctness(example: Example, answer: Any) -> float:
    """Score a program's answer for `example` in [0, 1], by task and dataset (see module docstring)."""
    if example.task == "grounding":
        return grounding_scores(example, answer)["iou"]
    if example.task == "itm":
        return _itm_accuracy(example, answer)
    if example.task in ("vqa", "video_qa"):
        if not example.answers:
            raise ValueError(f"Example {example.id!r} ({example.dataset}): no reference answers to score against")
        soft = (
            example.task == "vqa"
            and _dataset_key(example.dataset) in SOFT_ACCURACY_DATASETS
            and len(example.answers) >= _MIN_SOFT_REFERENCES
        )
        return vqa_soft_accuracy(answer, example.answers) if soft else exact_match(answer, example.answers)
    # Example validates its task on construction, so this only fires if TASKS grows without us.
    raise ValueError(f"Example {example.id!r}: no correctness rule for task {example.task!r}")
