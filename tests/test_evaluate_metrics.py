"""Evaluation metrics against the official definitions, on hand-written cases: GQA accuracy on
balanced questions with strings compared as they are (and the lenient variants beside it), VQA soft
accuracy over ten annotators, Winoground text/image/group (strict, so ties are wrong), SugarCREPE's
per-category accuracy (positive strictly above negative), IoU and accuracy at IoU 0.5, execution
rates, refusals, "right for the wrong reason", and fallback numbers kept apart.
tests/test_official_metrics.py checks the same on hundreds of generated predictions."""

import pytest

from vprl.data.records import Example
from vprl.train.evaluation.metrics import Prediction, dataset_metrics, headline_key, headline_value


def _ok(example_id, answer, **kw):
    return Prediction(example_id=example_id, answer=answer, status="ok", **kw)


def _vqa(i, answers, dataset="gqa", group="", structural="verify", balanced=True):
    meta = {"isBalanced": balanced, "types": {"structural": structural, "detailed": group}}
    return Example(
        id=f"q{i}", dataset=dataset, task="vqa", query="q?", image="x.png", answers=answers, group=group, meta=meta
    )


def test_gqa_official_accuracy_on_balanced_questions_with_the_lenient_variants_apart():
    examples = [
        _vqa(0, ["yes"], group="exist"),
        _vqa(1, ["no"], group="exist"),
        _vqa(2, ["red"], group="query_color", structural="query"),
        _vqa(3, ["2"], group="count", structural="query"),
        _vqa(4, ["no"], group="exist", balanced=False),  # not counted by the official accuracy
    ]
    preds = [_ok("q0", "Yes."), _ok("q1", "no"), _ok("q2", "the red"), _ok("q3", "2"), _ok("q4", "no")]
    m = dataset_metrics(examples, preds)
    assert m.headline == {"accuracy": 0.5, "binary": 0.5, "open": 0.5} and headline_key(m) == "accuracy"
    assert m.counted["accuracy"] == 4 and m.counted["binary"] == 2 and m.counted["open"] == 2
    assert m.per_group == {
        "count": {"accuracy": 1.0, "n": 1.0},
        "exist": {"accuracy": 0.5, "n": 2.0},  # "Yes." is not "yes" to the official script
        "query_color": {"accuracy": 0.0, "n": 1.0},  # nor is "the red" "red"
    }
    # vprl's training match normalises both sides, ViperGPT's the prediction: both take "Yes." and "the red"
    assert m.variants == {"vipergpt_accuracy": 1.0, "normalised_match": 1.0}
    failed = [*preds[:4], Prediction("q4", None, "runtime_error")]
    # ViperGPT reads a failed program as "no", which is q4's answer; the others count it wrong
    assert dataset_metrics(examples, failed).variants == {"vipergpt_accuracy": 1.0, "normalised_match": 0.8}
    with pytest.raises(ValueError, match="'q9'.*isBalanced"):
        dataset_metrics([Example("q9", "gqa", "vqa", "q?", "x.png", ("a",))], [_ok("q9", "a")])


@pytest.mark.parametrize(
    ("matching", "expected"),
    [(0, 0.0), (1, 0.3), (2, 0.6), (3, 0.9), (4, 1.0), (10, 1.0)],
)
def test_vqa_soft_accuracy_over_ten_annotators(matching, expected):
    """Official VQA: mean over the 10 leave-one-out subsets of min(#humans that said it / 3, 1)."""
    answers = ["red"] * matching + ["blue"] * (10 - matching)
    m = dataset_metrics([_vqa(0, answers, dataset="vqav2")], [_ok("q0", "Red")])
    assert m.headline["vqa_accuracy"] == pytest.approx(expected)
    assert dataset_metrics([_vqa(0, answers, dataset="okvqa")], [_ok("q0", "red")]).headline == m.headline


def _wino(wid, i, c, tag="Object"):
    return Example(
        id=f"w{wid}-i{i}-c{c}",
        dataset="winoground",
        task="itm",
        query=f'Verify image matches text="caption {c}"',
        image=f"img{i}.png",
        answers=["yes" if i == c else "no"],
        group=tag,
        meta={"winoground_id": str(wid), "image_index": i, "caption_index": c},
    )


def test_winoground_text_image_group_with_ties_wrong():
    examples, preds = [], []
    answers = {
        0: {(0, 0): "yes", (0, 1): "no", (1, 0): "no", (1, 1): "yes"},  # right everywhere
        1: {(0, 0): "yes", (0, 1): "yes", (1, 0): "yes", (1, 1): "yes"},  # all ties: wrong
        2: {(0, 0): "yes", (0, 1): "no", (1, 0): "no", (1, 1): "no"},  # 3 of 4 right, still wrong
        3: {(0, 0): "yes", (0, 1): "no", (1, 0): "no", (1, 1): None},  # a failed program: no answer
    }
    for wid, row in answers.items():
        for (i, c), a in row.items():
            e = _wino(wid, i, c, tag="Object" if wid < 2 else "Relation")
            examples.append(e)
            preds.append(_ok(e.id, a) if a is not None else Prediction(e.id, None, "runtime_error"))
    m = dataset_metrics(examples, preds)
    assert m.headline == {"text": 0.25, "image": 0.25, "group": 0.25}
    assert m.variants["item_accuracy"] == pytest.approx((4 + 2 + 3 + 3) / 16)
    assert headline_key(m) == "group" and headline_value(m) == 0.25
    assert m.per_group["Object"]["group"] == 0.5 and m.per_group["Relation"]["group"] == 0.0
    assert m.rates["exception_rate"] == pytest.approx(1 / 16)


def _crepe(category, entry, polarity):
    return Example(
        id=f"{category}-{entry}-{polarity}",
        dataset="sugarcrepe",
        task="itm",
        query='Verify image matches text="x"',
        image=f"{category}{entry}.png",
        answers=["yes" if polarity == "pos" else "no"],
        group=category,
        meta={"category": category, "entry": f"{category}/{entry}", "polarity": polarity},
    )


def test_sugarcrepe_official_accuracy_per_category():
    said = {
        ("replace_att", 0): ("yes", "no"),  # right
        ("replace_att", 1): ("yes", "yes"),  # a tie: wrong
        ("replace_att", 2): ("yes", None),  # a failure on the negative scores below yes: right
        ("swap_obj", 0): ("no", "no"),  # a tie: wrong
    }
    examples, preds = [], []
    for (cat, entry), (pos, neg) in said.items():
        for pol, a in (("pos", pos), ("neg", neg)):
            e = _crepe(cat, entry, pol)
            examples.append(e)
            preds.append(_ok(e.id, a) if a is not None else Prediction(e.id, None, "runtime_error"))
    m = dataset_metrics(examples, preds)
    assert m.headline == {"replace_att": pytest.approx(2 / 3), "swap_obj": 0.0}  # no mean: the script has none
    assert headline_key(m) == "category_mean" and headline_value(m) == pytest.approx(1 / 3)
    assert m.per_group["replace_att"] == {
        "accuracy": pytest.approx(2 / 3),
        "both_right": pytest.approx(1 / 3),  # the stricter rule wants the negative answered "no"
        "item_accuracy": pytest.approx(4 / 6),
        "n": 3.0,
    }
    assert m.variants["both_right"] == pytest.approx((1 / 3 + 0) / 2)
    assert m.variants["item_accuracy"] == pytest.approx(5 / 8)


def test_grounding_iou_and_accuracy_at_half():
    gt = (0.0, 0.0, 10.0, 20.0)
    examples = [
        Example(id=f"r{i}", dataset="refcoco", task="grounding", query="the star", image="x.png", box=gt, group=g)
        for i, g in enumerate(["star", "star", "circle", "circle"])
    ]
    preds = [
        _ok("r0", {"box": [0, 0, 10, 20]}),  # IoU 1
        _ok("r1", {"box": [0, 0, 10, 10]}),  # IoU 0.5: counts at the threshold
        _ok("r2", {"box": [5, 10, 15, 30]}),  # IoU 50 / 350
        _ok("r3", "not a box"),
    ]
    m = dataset_metrics(examples, preds)
    assert m.headline["acc50"] == 0.5 and headline_key(m) == "acc50"
    assert m.headline["miou"] == pytest.approx((1 + 0.5 + 50 / 350 + 0) / 4)
    assert m.per_group["star"]["acc50"] == 1.0 and m.per_group["circle"]["acc50"] == 0.0


def test_rates_refusals_right_for_wrong_reason_and_fallback_apart():
    examples = [_vqa(i, ["yes"]) for i in range(8)]  # balanced binary GQA questions
    preds = [
        _ok("q0", "yes", unit_test_score=1.0),
        _ok("q1", "yes", unit_test_score=0.2),  # right answer, program fails its tests
        _ok("q2", "yes", unit_test_score=0.4),  # same
        _ok("q3", "no", unit_test_score=0.1),  # wrong: not in the share's denominator
        _ok("q4", "yes", unit_test_score=0.3, refused=True),  # refused: no answer
        Prediction("q5", None, "runtime_error", error="IndexError", fallback_answer="yes"),
        Prediction("q6", None, "timeout", fallback_answer="no"),
        Prediction("q7", None, "syntax_error"),
    ]
    m = dataset_metrics(examples, preds)
    assert m.headline["accuracy"] == 3 / 8
    assert m.rates["exception_rate"] == 2 / 8 and m.rates["timeout_rate"] == 1 / 8
    assert m.rates["refusal_rate"] == 1 / 8 and m.rates["fallback_rate"] == 0.0
    assert m.rates["right_for_wrong_reason"] == pytest.approx(2 / 3)
    assert m.statuses == {"ok": 5, "runtime_error": 1, "syntax_error": 1, "timeout": 1}
    fb = dataset_metrics(examples, preds, use_fallback=True)
    assert fb.headline["accuracy"] == 4 / 8  # q5's fallback answer is right, q6's is not
    assert fb.rates["fallback_rate"] == 2 / 8
    assert fb.statuses == m.statuses  # the program's status is reported either way


def test_no_unit_tests_no_share_and_bad_input_named():
    examples = [_vqa(0, ["yes"]), _vqa(1, ["no"])]
    m = dataset_metrics(examples, [_ok("q0", "yes"), _ok("q1", "no")])
    assert "right_for_wrong_reason" not in m.rates
    with pytest.raises(ValueError, match=r"no prediction for 1 example\(s\), e.g. \['q1'\]"):
        dataset_metrics(examples, [_ok("q0", "yes")])
    other = Example(id="v", dataset="vqav2", task="vqa", query="q", image="x", answers=["a"] * 10)
    with pytest.raises(ValueError, match="one dataset and task at a time"):
        dataset_metrics([*examples, other], [_ok("q0", "yes"), _ok("q1", "no"), _ok("v", "a")])
    p = Prediction("q0", {"box": [1, 2, 3, 4]}, "ok", program="def f(): pass", unit_test_score=0.5, attempts=3)
    assert Prediction.from_json(p.to_json()) == p
