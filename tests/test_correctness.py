"""Correctness rewards, checked against values worked out by hand from the official definitions.

Normalisation cases follow the VQAv2 evaluation script (processPunctuation / processDigitArticle);
soft-accuracy literals are the leave-one-out average computed by hand for ten annotators.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vprl.data.records import Example
from vprl.rewards.answer_normalization import CONTRACTIONS, answer_to_text, normalize_answer
from vprl.rewards.correctness import (
    correctness,
    exact_match,
    grounding_scores,
    iou,
    parse_box,
    vqa_soft_accuracy,
    yes_no,
)

NORMALIZATION_CASES = [
    # punctuation: a mark touching a space is deleted, otherwise it becomes a space
    ("Yes.", "yes"),
    ("yes!", "yes"),
    ("t-shirt", "t shirt"),
    ("t - shirt", "t shirt"),
    ("red,white", "red white"),
    ("red, white", "red white"),
    ('"stop"', "stop"),
    ("one-way", "1 way"),
    ("(a)", ""),  # brackets become spaces, then the lone article goes
    ("left:right", "left:right"),  # colon is not in the official list
    ("it's", "it's"),  # neither is the apostrophe
    ("50%", "50%"),
    # digits: commas between digits vanish (and then every mark is deleted), periods stay before digits
    ("1,000", "1000"),
    ("1,000-2", "10002"),
    ("2.5", "2.5"),
    (".5", ".5"),
    ("3.", "3"),
    ("3.5.", "3.5"),
    ("u.s.a.", "usa"),
    # number words zero..ten and "none"
    ("Two", "2"),
    ("ten", "10"),
    ("eleven", "eleven"),
    ("none", "0"),
    ("two dogs", "2 dogs"),
    # articles
    ("The dog", "dog"),
    ("a cat", "cat"),
    ("an apple", "apple"),
    ("the one", "1"),
    ("theater", "theater"),
    # contractions
    ("dont", "don't"),
    ("isnt", "isn't"),
    ("Whats", "what's"),
    ("couldn'tve", "couldn't've"),
    ("somebody'd", "somebodyd"),  # the official table maps this one backwards
    ("Im", "im"),  # capitalised key in the official table; text is lower-cased first, so it never fires
    # whitespace
    ("  Yes \n", "yes"),
    ("yes\tno", "yes no"),
    ("", ""),
]


@pytest.mark.parametrize(("raw", "expected"), NORMALIZATION_CASES)
def test_normalize_answer_official_cases(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


def test_contractions_table_is_the_full_official_list() -> None:
    assert len(CONTRACTIONS) == 120
    assert CONTRACTIONS["yall'd've"] == "y'all'd've"
    assert CONTRACTIONS["oclock"] == "o'clock"


def test_normalize_answer_rejects_non_strings() -> None:
    with pytest.raises(TypeError, match="expects a str"):
        normalize_answer(2)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (True, "yes"),
        (False, "no"),
        (2, "2"),
        (2.0, "2"),
        (2.5, "2.5"),
        ("cat", "cat"),
        (None, None),
        (["cat"], None),
        ({"box": [0, 0, 1, 1]}, None),
        (math.nan, None),
        (math.inf, None),
    ],
)
def test_answer_to_text(answer: object, expected: str | None) -> None:
    assert answer_to_text(answer) == expected


def _refs(matching: str, k: int, other: str = "zebra", n: int = 10) -> list[str]:
    return [matching] * k + [other] * (n - k)


@pytest.mark.parametrize(
    ("k", "expected"),
    [
        (0, 0.0),
        (1, 0.3),  # 9 subsets hold 1 match: 9 * (1/3) / 10
        (2, 0.6),  # 2 * (1/3) + 8 * (2/3) = 6, / 10
        (3, 0.9),  # 3 * (2/3) + 7 * 1 = 9, / 10: the leave-one-out average, not 1.0
        (4, 1.0),
        (10, 1.0),
    ],
)
def test_vqa_soft_accuracy_ten_annotators(k: int, expected: float) -> None:
    assert vqa_soft_accuracy("cat", _refs("cat", k)) == pytest.approx(expected)


def test_vqa_soft_accuracy_normalises_both_sides_and_converts_values() -> None:
    assert vqa_soft_accuracy("Two", _refs("2", 3)) == pytest.approx(0.9)
    assert vqa_soft_accuracy(2.0, _refs("two", 2)) == pytest.approx(0.6)
    assert vqa_soft_accuracy(True, _refs("Yes", 10)) == pytest.approx(1.0)
    assert vqa_soft_accuracy(None, _refs("yes", 10)) == 0.0
    assert vqa_soft_accuracy({"box": [0, 0, 1, 1]}, _refs("yes", 10)) == 0.0


def test_vqa_soft_accuracy_fewer_than_ten_references() -> None:
    # 5 references, 2 match: 2 subsets keep 1 match (1/3), 3 keep 2 (2/3): (2/3 + 2) / 5 = 8/15
    assert vqa_soft_accuracy("cat", _refs("cat", 2, n=5)) == pytest.approx(8 / 15)
    # A single reference leaves an empty subset: the formula's ceiling is 0 there.
    assert vqa_soft_accuracy("cat", ["cat"]) == 0.0
    with pytest.raises(ValueError, match="at least one reference"):
        vqa_soft_accuracy("cat", [])


@pytest.mark.parametrize(
    ("box_a", "box_b", "expected"),
    [
        ((0, 0, 10, 10), (0, 0, 10, 10), 1.0),
        ((0, 0, 10, 10), (5, 5, 15, 15), 25 / 175),
        ((0, 0, 10, 10), (0, 0, 5, 10), 0.5),
        ((0, 0, 10, 10), (10, 0, 20, 10), 0.0),  # touching edges
        ((0, 0, 10, 10), (20, 20, 30, 30), 0.0),
        ((3, 3, 3, 3), (3, 3, 3, 3), 0.0),  # empty union
        ((0, 0, 4, 2), (2, 0, 6, 2), 4 / 12),
    ],
)
def test_iou_known_boxes(box_a: tuple, box_b: tuple, expected: float) -> None:
    assert iou(box_a, box_b) == pytest.approx(expected)


@pytest.mark.parametrize("bad", [(0, 0, 10), (10, 0, 0, 10), (0, 10, 10, 0), (0, 0, math.nan, 1), ("a", 0, 1, 1)])
def test_iou_rejects_malformed_boxes(bad: tuple) -> None:
    with pytest.raises(ValueError, match="box"):
        iou(bad, (0, 0, 1, 1))


def _ex(task: str, dataset: str, answers: tuple[str, ...] = (), box: tuple | None = None) -> Example:
    return Example(id="e1", dataset=dataset, task=task, query="q", image="img.png", answers=answers, box=box)


def test_grounding_scores() -> None:
    ex = _ex("grounding", "refcoco", box=(0, 0, 10, 10))
    assert grounding_scores(ex, {"box": [0, 0, 5, 10]}) == pytest.approx({"iou": 0.5, "acc50": 1.0})
    assert grounding_scores(ex, {"box": [0, 0, 4, 10], "category": "dog"}) == pytest.approx({"iou": 0.4, "acc50": 0.0})
    for not_a_box in ("left", None, [0, 0, 5, 10], {"box": [0, 0, 5]}, {"box": [5, 0, 0, 10]}, True):
        assert grounding_scores(ex, not_a_box) == {"iou": 0.0, "acc50": 0.0}
    assert correctness(ex, {"box": [0, 0, 5, 10]}) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="has no box"):
        grounding_scores(_ex("grounding", "refcoco"), {"box": [0, 0, 1, 1]})


def test_parse_box() -> None:
    assert parse_box({"box": [1, 2, 3, 4]}) == (1.0, 2.0, 3.0, 4.0)
    assert parse_box({"box": [1, 2, math.inf, 4]}) is None
    assert parse_box({"answer": [1, 2, 3, 4]}) is None


@pytest.mark.parametrize(
    ("answer", "reference", "expected"),
    [
        ("Yes.", "yes", 1.0),
        ("YES", "yes", 1.0),
        (" no! ", "No", 1.0),
        (True, "yes", 1.0),
        (False, "no", 1.0),
        ("yes", "no", 0.0),
        ("maybe", "yes", 0.0),
        ("yes, definitely", "yes", 0.0),
        (1, "yes", 0.0),
        (None, "no", 0.0),
    ],
)
def test_itm_yes_no(answer: object, reference: str, expected: float) -> None:
    for dataset in ("winoground", "sugarcrepe", "shapes"):
        assert correctness(_ex("itm", dataset, (reference,)), answer) == expected


def test_itm_rejects_non_yes_no_reference() -> None:
    with pytest.raises(ValueError, match="not yes/no"):
        correctness(_ex("itm", "winoground", ("maybe",)), "yes")
    assert yes_no("No.") == "no"


@pytest.mark.parametrize(
    ("answer", "reference", "expected"),
    [
        ("The table", "table", 1.0),
        (2.0, "2", 1.0),
        (2, "two", 1.0),
        (True, "yes", 1.0),
        (False, "yes", 0.0),
        ("tables", "table", 0.0),
        (["table"], "table", 0.0),
        (None, "table", 0.0),
    ],
)
def test_gqa_exact_match(answer: object, reference: str, expected: float) -> None:
    assert correctness(_ex("vqa", "gqa", (reference,)), answer) == expected


def test_dispatch_by_dataset_name() -> None:
    refs = tuple(_refs("cat", 3))
    assert correctness(_ex("vqa", "vqav2", refs), "Cat") == pytest.approx(0.9)
    assert correctness(_ex("vqa", "OK-VQA", refs), "cat") == pytest.approx(0.9)
    # Every other dataset (GQA-style default) is exact match against any reference.
    assert correctness(_ex("vqa", "gqa", refs), "cat") == 1.0
    assert correctness(_ex("vqa", "someunknownset", refs), "cat") == 1.0
    # Too few references for soft accuracy to reach 1: exact match instead.
    assert correctness(_ex("vqa", "vqav2", ("cat",)), "cat") == 1.0
    assert correctness(_ex("video_qa", "nextqa", ("the dog runs",)), "Dog runs.") == 1.0
    assert exact_match("dog", ("cat", "dog")) == 1.0
    with pytest.raises(ValueError, match="no reference answers"):
        correctness(_ex("vqa", "gqa"), "cat")


# Text drawn from the characters the normalisation treats specially, plus arbitrary unicode.
_TRICKY = st.lists(
    st.sampled_from([*"abt ne.,-!?()'0123456789\n\t;:/\"", "two", "dont", "the", "none", "I'dve"]), max_size=30
).map("".join)


@given(st.one_of(_TRICKY, st.text()))
def test_normalize_answer_is_idempotent(text: str) -> None:
    once = normalize_answer(text)
    assert normalize_answer(once) == once


_COORD = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False)


@st.composite
def _boxes(draw: st.DrawFn) -> tuple[float, float, float, float]:
    x0, x1 = sorted((draw(_COORD), draw(_COORD)))
    y0, y1 = sorted((draw(_COORD), draw(_COORD)))
    return (x0, y0, x1, y1)


@given(_boxes(), _boxes())
def test_iou_symmetric_and_bounded(a: tuple, b: tuple) -> None:
    value = iou(a, b)
    assert 0.0 <= value <= 1.0
    assert value == pytest.approx(iou(b, a))


@given(
    st.lists(st.sampled_from(["cat", "Cat.", "dog", "two", "2"]), min_size=1, max_size=10), st.permutations(range(10))
)
def test_soft_accuracy_bounded_and_order_free(refs: list[str], order: list[int]) -> None:
    shuffled = [refs[i] for i in order if i < len(refs)]
    for answer in ("cat", "2"):
        value = vqa_soft_accuracy(answer, refs)
        assert 0.0 <= value <= 1.0
        assert value == pytest.approx(vqa_soft_accuracy(answer, shuffled))
