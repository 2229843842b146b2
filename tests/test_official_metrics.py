"""The headline of every dataset is its official metric: on hundreds of generated predictions (yes/no,
free text with punctuation and articles, failed programs, unbalanced questions, ties), the number
`dataset_metrics` reports equals the official definition restated here the way the official script
states it, on data read through the project's loaders from files in the official formats. The
lenient and paper-specific variants are reported beside the headline, under their own names.

The restatements follow: GQA's eval.py (prediction == answer on balanced questions, binary/open by
structural type), SugarCREPE's main_eval.py (positive strictly above negative, per category),
Winoground's text/image/group scores, NExT-QA's eval_mc.py (index comparison, TP counted as TN) and,
for RefCOCO, which has no official script, IoU >= 0.5 accuracy and mean IoU with ViperGPT's
RefCOCO code beside them (its mean box for failures, IoU > 0.7).
"""

from __future__ import annotations

import csv
import json
import random
from collections import defaultdict

import pytest

from vprl.data.loaders import load_dataset
from vprl.data.loaders.sugarcrepe import CATEGORIES
from vprl.data.records import Example
from vprl.train.evaluation.metrics import Prediction, dataset_metrics, headline_value
from vprl.train.evaluation.report import markdown, to_json

RNG_SEED = 25


def _prediction(example_id, answer):
    if answer is None:  # a failed program has no answer
        return Prediction(example_id, None, "runtime_error", error="IndexError: list index out of range")
    return Prediction(example_id, answer, "ok")


# -- GQA -----------------------------------------------------------------------------------------
GQA_ANSWERS = {"verify": ["yes", "no"], "query": ["red", "metal", "t-shirt", "silver", "2", "man"]}


def _gqa_files(tmp_path, rng, n=400):
    questions, said = {}, {}
    for i in range(n):
        structural = rng.choice(["verify", "logical", "choose", "compare", "query"])
        gold = rng.choice(GQA_ANSWERS["query" if structural == "query" else "verify"])
        qid = f"{1000 + i}"
        questions[qid] = {
            "imageId": f"img{i % 37}",
            "question": f"question {i}?",
            "answer": gold,
            "isBalanced": rng.random() < 0.75,
            "types": {"structural": structural, "semantic": "attr", "detailed": f"{structural}Attr"},
        }
        said[qid] = rng.choice(
            [
                gold,
                gold,
                gold.capitalize(),
                gold + ".",
                f"a {gold}",
                f"the {gold}",
                "no" if gold == "yes" else "yes",
                "blue",
                None,
                gold == "yes" if gold in ("yes", "no") else gold,
            ]
        )
    (tmp_path / "val_balanced_questions.json").write_text(json.dumps(questions))
    return questions, said


def _gqa_official(questions, predictions):
    """GQA eval.py: `predicted == gold` counted on balanced questions only; answer type "open" for
    structural type query, else "binary"; an empty list averages to 0."""
    scores = {"accuracy": [], "binary": [], "open": []}
    for qid, question in questions.items():
        if question["isBalanced"]:
            score = float(predictions[qid] == question["answer"])
            scores["accuracy"].append(score)
            scores["open" if question["types"]["structural"] == "query" else "binary"].append(score)
    return {k: sum(v) / len(v) if v else 0 for k, v in scores.items()}


def _submitted(answer):
    """What the predictions file holds for a program's answer: its text, True/False as yes/no."""
    return {True: "yes", False: "no"}.get(answer, answer) if isinstance(answer, bool) else answer


def test_gqa_headline_is_the_official_accuracy(tmp_path):
    rng = random.Random(RNG_SEED)
    questions, said = _gqa_files(tmp_path, rng)
    examples = load_dataset("gqa", tmp_path)
    preds = [_prediction(e.id, said[e.meta["questionId"]]) for e in examples]
    m = dataset_metrics(examples, preds)
    official = _gqa_official(questions, {qid: _submitted(a) for qid, a in said.items()})
    assert m.headline == pytest.approx(official)
    assert headline_value(m) == pytest.approx(official["accuracy"])
    assert m.counted["accuracy"] == sum(q["isBalanced"] for q in questions.values()) < len(questions)
    # the lenient variants are computed over every question and are higher: they forgive "Yes", "a metal", "no."
    assert m.variants["normalised_match"] > m.headline["accuracy"]
    assert m.variants["vipergpt_accuracy"] > m.headline["accuracy"]


def test_gqa_variants_follow_vipergpt_and_the_training_reward():
    def gqa(i, gold):
        meta = {"isBalanced": True, "types": {"structural": "query"}}
        return Example(f"g{i}", "gqa", "vqa", "q?", "x.png", (gold,), meta=meta)

    cases = [("t-shirt", "t-shirt"), ("t shirt", "t-shirt"), ("A Metal.", "metal"), (None, "no"), ([], "no")]
    examples = [gqa(i, gold) for i, (_, gold) in enumerate(cases)]
    m = dataset_metrics(examples, [_prediction(e.id, a) for e, (a, _) in zip(examples, cases)])
    assert m.headline["accuracy"] == pytest.approx(1 / 5)  # only the exact "t-shirt"
    # ViperGPT normalises the prediction alone: "t-shirt" becomes "t shirt" and misses the answer,
    # "A Metal." becomes "metal", and a failure and an empty list become "no"
    assert m.variants["vipergpt_accuracy"] == pytest.approx(3 / 5)
    # both sides normalised: the hyphen goes on both; a failure or a list has no text
    assert m.variants["normalised_match"] == pytest.approx(3 / 5)


# -- SugarCREPE ----------------------------------------------------------------------------------
YES_LIKE, NO_LIKE, NEITHER = ["yes", "Yes", "yes.", True], ["no", "No", "no.", False], [None, "a dog", ""]


def _yes(answer) -> int:
    return int(answer is True or (isinstance(answer, str) and answer.lower().rstrip(".") == "yes"))


def test_sugarcrepe_headline_is_the_official_per_category_accuracy(tmp_path):
    rng = random.Random(RNG_SEED + 1)
    data = tmp_path / "data"
    data.mkdir()
    said = {}
    for c, category in enumerate(CATEGORIES):
        entries = {}
        for i in range(40 + 3 * c):
            entries[str(i)] = {"filename": f"{i:012d}.jpg", "caption": f"pos {i}", "negative_caption": f"neg {i}"}
            for polarity in ("pos", "neg"):
                said[f"sugarcrepe-{category}-{i}-{polarity}"] = rng.choice(YES_LIKE + NO_LIKE + NEITHER)
        (data / f"{category}.json").write_text(json.dumps(entries))
    examples = load_dataset("sugarcrepe", tmp_path)
    m = dataset_metrics(examples, [_prediction(e.id, said[e.id]) for e in examples])

    official = {}  # main_eval.py: per category, 1 if pos_score > neg_score else 0, averaged
    for category in CATEGORIES:
        entries = json.loads((data / f"{category}.json").read_text())
        right = [
            _yes(said[f"sugarcrepe-{category}-{i}-pos"]) > _yes(said[f"sugarcrepe-{category}-{i}-neg"])
            for i in entries
        ]
        official[category] = sum(right) / len(right)
    assert m.headline == pytest.approx(official) and list(m.headline) == list(CATEGORIES)
    assert headline_value(m) == pytest.approx(sum(official.values()) / len(official))  # named category_mean
    # the stricter rule wants "no" for the negative: a failure there is wrong, so it is lower
    assert m.variants["both_right"] < m.variants["category_mean"]


# -- Winoground ----------------------------------------------------------------------------------
def test_winoground_headline_is_the_official_text_image_group(tmp_path):
    rng = random.Random(RNG_SEED + 2)
    data = tmp_path / "data"
    data.mkdir()
    rows = [
        {"id": i, "image_0": f"ex_{i}_img_0", "image_1": f"ex_{i}_img_1", "caption_0": f"a {i}", "caption_1": f"b {i}",
         "tag": rng.choice(["Object", "Relation", "Both"]), "secondary_tag": "", "num_main_preds": 1,
         "collapsed_tag": "Relation"}
        for i in range(120)
    ]  # fmt: skip
    (data / "examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples = load_dataset("winoground", tmp_path)
    said = {e.id: rng.choice(YES_LIKE + NO_LIKE + NEITHER) for e in examples}
    m = dataset_metrics(examples, [_prediction(e.id, said[e.id]) for e in examples])

    s = defaultdict(dict)  # s[id][(image, caption)] = the score of that pairing
    for e in examples:
        s[e.meta["winoground_id"]][e.meta["image_index"], e.meta["caption_index"]] = _yes(said[e.id])
    text = [v[0, 0] > v[0, 1] and v[1, 1] > v[1, 0] for v in s.values()]
    image = [v[0, 0] > v[1, 0] and v[1, 1] > v[0, 1] for v in s.values()]
    group = [t and i for t, i in zip(text, image)]
    expected = {k: sum(v) / len(v) for k, v in (("text", text), ("image", image), ("group", group))}
    assert m.headline == pytest.approx(expected) and headline_value(m) == pytest.approx(expected["group"])
    assert set(m.variants) == {"item_accuracy"}


# -- RefCOCO -------------------------------------------------------------------------------------
def _iou(a, b):
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union if union > 0 else 0.0


def test_grounding_headline_is_acc_at_half_and_miou_with_vipergpts_convention_beside(tmp_path):
    rng = random.Random(RNG_SEED + 3)
    examples, said = [], {}
    for i in range(300):
        left, lower = rng.uniform(0, 300), rng.uniform(0, 200)
        gt = (left, lower, left + rng.uniform(20, 300), lower + rng.uniform(20, 250))
        e = Example(f"r{i}", "refcoco", "grounding", f"thing {i}", "x.jpg", box=gt, group=rng.choice(["a", "b"]))
        examples.append(e)
        kind = rng.random()
        if kind < 0.15:
            said[e.id] = None  # the program failed
        elif kind < 0.2:
            said[e.id] = "the man on the left"  # not a box
        elif kind < 0.25:
            said[e.id] = {"box": [gt[0], gt[1], gt[2], (gt[1] + gt[3]) / 2]}  # IoU exactly 0.5
        else:
            dx, dy = rng.uniform(-60, 60), rng.uniform(-60, 60)
            said[e.id] = {"box": [gt[0] + dx, gt[1] + dy, gt[2] + dx, gt[3] + dy]}
    m = dataset_metrics(examples, [_prediction(e.id, said[e.id]) for e in examples])
    ious = [_iou(said[e.id]["box"], e.box) if isinstance(said[e.id], dict) else 0.0 for e in examples]
    assert m.headline["acc50"] == pytest.approx(sum(v >= 0.5 for v in ious) / len(ious))
    assert m.headline["miou"] == pytest.approx(sum(ious) / len(ious))
    mean_box = (50.9, 39.1, 493.5, 356.5)  # ViperGPT's datasets/refcoco.py, for a failed program
    viper = [_iou(mean_box, e.box) if said[e.id] is None else v for e, v in zip(examples, ious)]
    assert m.variants["vipergpt_miou"] == pytest.approx(sum(viper) / len(viper))
    assert m.variants["vipergpt_acc70"] == pytest.approx(sum(v > 0.7 for v in viper) / len(viper))


# -- NExT-QA -------------------------------------------------------------------------------------
def test_nextqa_headline_is_the_official_accuracy_by_type(tmp_path):
    rng = random.Random(RNG_SEED + 4)
    options = ["runs away", "sits down", "picks it up", "two", "the kitchen", "laughs", "waves"]
    rows, said = [], {}
    for i in range(350):
        five = rng.sample(options, 5)
        row = {"video": str(4000 + i // 5), "frame_count": 90, "width": 64, "height": 48,
               "question": f"what happens {i}", "answer": rng.randrange(5), "qid": i % 5,
               "type": rng.choice(["CW", "CH", "TN", "TC", "TP", "DC", "DL", "DO"]),
               **{f"a{k}": five[k] for k in range(5)}}  # fmt: skip
        rows.append(row)
        right = five[row["answer"]]
        said[f"{row['video']}_{row['qid']}"] = rng.choice(
            [right, right, right.upper(), f"{right}.", rng.choice(five), "none of them", None]
        )
    with open(tmp_path / "val.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    examples = load_dataset("nextqa", tmp_path)
    m = dataset_metrics(examples, [_prediction(e.id, said[f"{e.meta['video']}_{e.meta['qid']}"]) for e in examples])

    # eval_mc.py: group by type (TP into TN), right when the predicted index is the answer index
    group = defaultdict(list)
    for row in rows:
        options_of = [row[f"a{k}"] for k in range(5)]
        answer = said[f"{row['video']}_{row['qid']}"]
        prediction = options_of.index(answer) if answer in options_of else -1
        group["TN" if row["type"] == "TP" else row["type"]].append(prediction == row["answer"])
    every = [v for values in group.values() for v in values]
    expected = {"accuracy": sum(every) / len(every)}
    for letter, name in (("C", "causal"), ("T", "temporal"), ("D", "descriptive")):
        values = [v for qtype, vs in group.items() if qtype[0] == letter for v in vs]
        expected[name] = sum(values) / len(values)
    assert m.headline == pytest.approx(expected)
    assert {g: row["accuracy"] for g, row in m.per_group.items()} == pytest.approx(
        {g: sum(v) / len(v) for g, v in group.items()}
    )
    assert "TP" not in m.per_group and m.variants["normalised_match"] > m.headline["accuracy"]


# -- reports -------------------------------------------------------------------------------------
def test_reports_show_the_official_numbers_and_name_the_variants(tmp_path):
    rng = random.Random(RNG_SEED)
    questions, said = _gqa_files(tmp_path, rng, n=60)
    examples = load_dataset("gqa", tmp_path)
    m = dataset_metrics(examples, [_prediction(e.id, said[e.meta["questionId"]]) for e in examples])
    results = {"base": {"single": {"gqa": {0: m}}}}
    text = markdown(results)
    assert "| policy | gqa (accuracy) |" in text
    assert f"official accuracy {100 * m.headline['accuracy']:.1f} (of {m.counted['accuracy']})" in text
    assert f"variants vipergpt_accuracy {100 * m.variants['vipergpt_accuracy']:.1f}" in text
    assert "`normalised_match`: vprl's training reward" in text
    assert "`accuracy`: official (GQA eval.py)" in text
    data = to_json(results)
    assert data["headline"] == {"gqa": "accuracy"}
    assert set(data["conventions"]["gqa"]) == {"accuracy", "binary", "open", "vipergpt_accuracy", "normalised_match"}
