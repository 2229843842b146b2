"""Sampling recipes on synthetic official-format files big enough to give the papers' counts."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from vprl.data.loaders.gqa import load_gqa_questions
from vprl.data.loaders.sampling import (
    gqa_eval_sample,
    gqa_train_sample,
    okvqa_sample,
    sample_per_group,
    split_id,
    sugarcrepe_splits,
    vqav2_sample,
)
from vprl.data.loaders.sugarcrepe import CATEGORIES, load_sugarcrepe
from vprl.data.loaders.vqav2 import load_vqa


def write_gqa(path: Path, sizes: dict[str, int]) -> Path:
    rows, n = {}, 0
    for family, size in sizes.items():
        for _ in range(size):
            rows[f"{n:08d}"] = {
                "imageId": f"img{n % 37}", "question": f"Question {n}?", "answer": "yes", "fullAnswer": "Yes.",
                "types": {"structural": "verify", "semantic": "attr", "detailed": family},
                "groups": {"global": None, "local": f"local-{n}"},
            }  # fmt: skip
            n += 1
    path.write_text(json.dumps(rows))
    return path


@pytest.fixture(scope="module")
def gqa_pool(tmp_path_factory):
    sizes = {f"family{g:02d}": 20 for g in range(12)} | {"typeVerifyC": 3, "companyVerify": 1}
    path = write_gqa(tmp_path_factory.mktemp("gqa") / "val_balanced_questions.json", sizes)
    return load_gqa_questions(path, "images")


def test_gqa_eval_and_train_counts(gqa_pool):
    ev = gqa_eval_sample(gqa_pool, seed=0)
    assert len(ev.examples) == 12 * 5 + 3 + 1  # small families are taken whole
    counts = Counter(e.group for e in ev.examples)
    assert counts["family07"] == 5 and counts["typeVerifyC"] == 3 and counts["companyVerify"] == 1
    tr = gqa_train_sample(gqa_pool, seed=0)
    assert len(tr.examples) == 12 * 10 + 4
    assert ev.split_id.startswith("gqa-eval-5pg-s0-") and tr.split_id.startswith("gqa-train-10pg-s0-")


def test_sampling_is_deterministic_and_order_independent(gqa_pool):
    a = gqa_eval_sample(gqa_pool, seed=3)
    shuffled = list(gqa_pool)
    random.Random(1).shuffle(shuffled)
    b = gqa_eval_sample(shuffled, seed=3)
    assert a.ids == b.ids and a.split_id == b.split_id
    c = gqa_eval_sample(gqa_pool, seed=4)
    assert set(c.ids) != set(a.ids) and c.split_id != a.split_id
    # picks inside one group do not depend on the other groups being present
    only07 = [e for e in gqa_pool if e.group == "family07"]
    assert gqa_eval_sample(only07, seed=3).ids == [e.id for e in a.examples if e.group == "family07"]


def test_split_id_and_manifest(gqa_pool):
    s = gqa_eval_sample(gqa_pool, seed=0)
    assert split_id("x", ["b", "a"]) == split_id("x", ["a", "b"]) != split_id("x", ["a", "c"])
    m = s.manifest()
    assert json.loads(json.dumps(m)) == m
    assert m["n"] == 64 and m["ids"] == s.ids and m["per_group"]["family00"] == 5 and m["seed"] == 0


def test_per_group_rejects_bad_pools(gqa_pool):
    with pytest.raises(ValueError, match="duplicate Example ids"):
        sample_per_group([*gqa_pool, gqa_pool[0]], 5, seed=0)
    with pytest.raises(ValueError, match="example 'gqa-00000001' has no group"):
        sample_per_group([gqa_pool[0], replace(gqa_pool[1], group="")], 5, seed=0)
    with pytest.raises(ValueError, match="k must be positive"):
        sample_per_group(gqa_pool, 0, seed=0)


def write_vqa(
    tmp: Path, answer_counts: dict[str, int], qtype=lambda i, a: "what is the", raw=False
) -> tuple[Path, Path]:
    questions, annotations, qid = [], [], 0
    for ans, count in answer_counts.items():
        for _ in range(count):
            image_id = 1000 + qid // 3
            questions.append({"image_id": image_id, "question": f"What is {qid}?", "question_id": qid})
            ann = {
                "question_id": qid,
                "image_id": image_id,
                "question_type": qtype(qid, ans),
                "answer_type": "other",
                "answers": [{"answer": ans, "answer_confidence": "yes", "answer_id": k + 1} for k in range(10)],
            }
            if not raw:
                ann["multiple_choice_answer"] = ans
            annotations.append(ann)
            qid += 1
    qp, ap = tmp / "questions.json", tmp / "annotations.json"
    qp.write_text(json.dumps({"data_subtype": "val2014", "questions": questions}))
    ap.write_text(json.dumps({"data_subtype": "val2014", "annotations": annotations}))
    return qp, ap


def test_vqav2_ten_per_top_fifty_answers(tmp_path):
    counts = {f"ans{k:02d}": 70 - k for k in range(60)}  # ans00 most common ... ans59 least
    pool = load_vqa(*write_vqa(tmp_path, counts), tmp_path)
    s = vqav2_sample(pool, seed=0)
    assert len(s.examples) == 500
    per_answer = Counter(e.meta["multiple_choice_answer"] for e in s.examples)
    assert set(per_answer) == {f"ans{k:02d}" for k in range(50)} and set(per_answer.values()) == {10}
    assert s.split_id.startswith("vqav2-top50x10-s0-")
    assert vqav2_sample(list(reversed(pool)), seed=0).ids == s.ids


def test_vqav2_ties_break_by_answer_text_and_need_annotations(tmp_path):
    pool = load_vqa(*write_vqa(tmp_path, {"zebra": 12, "apple": 12, "cat": 20}), tmp_path)
    s = vqav2_sample(pool, seed=0, n_answers=2, per_answer=10)
    assert set(e.meta["multiple_choice_answer"] for e in s.examples) == {"cat", "apple"}
    with pytest.raises(ValueError, match="only 3 distinct answers, fewer than n_answers=50"):
        vqav2_sample(pool)
    raw = load_vqa(*write_vqa(tmp_path, {"x": 2}, raw=True), tmp_path)
    with pytest.raises(ValueError, match="has no meta\\['multiple_choice_answer'\\]"):
        vqav2_sample(raw, n_answers=1)


def test_okvqa_ten_per_question_type(tmp_path):
    types = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "other"]
    qp, ap = write_vqa(tmp_path, {f"a{k}": 15 for k in range(11)}, qtype=lambda i, a: types[int(a[1:])], raw=True)
    pool = load_vqa(qp, ap, tmp_path, dataset="okvqa")
    s = okvqa_sample(pool, seed=0)
    assert len(s.examples) == 110 and set(Counter(e.group for e in s.examples).values()) == {10}


def write_sugarcrepe(tmp: Path, sizes: dict[str, int]) -> list:
    for cat, size in sizes.items():
        entries = {
            str(i): {"filename": f"{i:012d}.jpg", "caption": f"{cat} pos {i}", "negative_caption": f"{cat} neg {i}"}
            for i in range(size)
        }
        (tmp / f"{cat}.json").write_text(json.dumps(entries))
    return load_sugarcrepe(tmp, tmp / "val2017")


def test_sugarcrepe_eval_40_per_category_and_balanced_train(tmp_path):
    pool = write_sugarcrepe(tmp_path, dict.fromkeys(CATEGORIES, 100))
    train, ev = sugarcrepe_splits(pool, seed=0)
    assert len(ev.examples) == 7 * 40 * 2 == 560
    assert set(Counter(e.group for e in ev.examples).values()) == {80}
    # 10% of the 7 * 60 remaining entries = 42 entries = 6 per category, each with pos and neg
    assert len(train.examples) == 84 and set(Counter(e.group for e in train.examples).values()) == {12}
    assert not set(train.ids) & set(ev.ids)
    for sample in (train, ev):
        pairs = Counter(e.meta["entry"] for e in sample.examples)
        assert set(pairs.values()) == {2}  # positive and negative never separated
    again = sugarcrepe_splits(list(reversed(pool)), seed=0)
    assert (again[0].split_id, again[1].split_id) == (train.split_id, ev.split_id)
    assert sugarcrepe_splits(pool, seed=1)[1].split_id != ev.split_id


def test_sugarcrepe_small_category_is_taken_whole(tmp_path):
    pool = write_sugarcrepe(tmp_path, dict.fromkeys(CATEGORIES, 100) | {"swap_obj": 44})
    train, ev = sugarcrepe_splits(pool, seed=0)
    assert Counter(e.group for e in ev.examples)["swap_obj"] == 80
    per_cat = Counter(e.meta["entry"].split("/")[0] for e in train.examples)
    # target round(0.1 * 364) = 36 -> quotas 6,5,5,5,5,5,5 in sorted order; swap_obj has only 4 left
    assert per_cat == {"add_att": 12, "add_obj": 10, "replace_att": 10, "replace_obj": 10, "replace_rel": 10,
                       "swap_att": 10, "swap_obj": 8}  # fmt: skip
    with pytest.raises(ValueError, match="train_fraction must be in"):
        sugarcrepe_splits(pool, train_fraction=0)


@pytest.mark.parametrize("weight", [1e-7, 1e-320])
def test_item6_a_tiny_mixture_weight_is_named_not_a_memory_error(weight):
    from vprl.data.loaders.sampling import EpochTooLong, mixture_rows

    with pytest.raises(EpochTooLong, match=r"needs an epoch of .* rows to draw each of its 30 examples once") as got:
        mixture_rows([100, 30, 5], [1.0, weight, 0.5])
    assert got.value.index == 1
    assert mixture_rows([100, 30], [1.0, 0.25]) == [120, 30]  # a real weight is still an epoch
