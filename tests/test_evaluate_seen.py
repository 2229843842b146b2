"""Seen and unseen questions: with `seen_from` and `seen_split`, a dataset is reported as its
`-unseen` part (queries never trained on) and its `-seen` part, a partition of its examples."""

from __future__ import annotations

import json

import pytest
from evaluate_helpers import ScriptedPolicy, all_gold, build_world

from vprl.data.shapes.tasks import load_shapes_task
from vprl.train.evaluation.pipeline import EvalConfig, evaluate
from vprl.train.evaluation.plan import parse_datasets
from vprl.train.evaluation.seen import check_seen_settings, normalize_query, seen_queries, split_seen


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("seen_world")
    build_world(root, val=12)
    return root


def test_queries_compare_by_their_words():
    assert normalize_query("  Is the RED circle  left of the square? ") == "is the red circle left of the square"


def test_the_split_is_a_partition_by_training_queries(world, tmp_path):
    train = load_shapes_task(world, "train")
    val = load_shapes_task(world, "val")
    seen = seen_queries(str(world))
    assert seen == {normalize_query(e.query) for e in train}
    parts = split_seen({"shapes:val": val, "other": train[:2]}, ["shapes:val"], seen)
    assert list(parts)[0] == "shapes:val-unseen" and parts["other"] == train[:2]
    rows = [e for name in parts if name.startswith("shapes:val") for e in parts[name]]
    assert sorted(e.id for e in rows) == sorted(e.id for e in val)
    assert all(normalize_query(e.query) not in seen for e in parts["shapes:val-unseen"])
    assert all(normalize_query(e.query) in seen for e in parts.get("shapes:val-seen", []))
    # a JSONL of examples works as the training set too
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(e.to_json()) + "\n" for e in val[:3]))
    only = split_seen({"v": val}, ["v"], seen_queries(str(path)))
    assert {e.id for e in only["v-seen"]} >= {e.id for e in val[:3]}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seen_split": "shapes:val"}, r"seen_split: needs seen_from"),
        ({"seen_split": "shapes:heldout", "seen_from": "W"}, r"seen_split: \['shapes:heldout'\] are not among"),
        ({"seen_split": "shapes:val", "seen_from": "/no/such"}, r"seen_from: /no/such does not exist"),
    ],
)
def test_bad_seen_settings_are_refused(world, change, message):
    change = {k: (str(world) if v == "W" else v) for k, v in change.items()}
    cfg = EvalConfig(shapes_root=str(world), datasets="shapes:val", **change)
    with pytest.raises(ValueError, match=message):
        check_seen_settings(cfg.seen_from, cfg.seen_split, parse_datasets(cfg))


def test_the_pipeline_reports_both_parts(world, tmp_path):
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "config.json").write_text("{}")
    cfg = EvalConfig(
        model_name_or_path=str(tmp_path / "policy"),
        shapes_root=str(world),
        datasets=["shapes:val", "shapes:heldout"],
        seen_from=str(world),
        seen_split=["shapes:val"],
        prompt_layout="bare",
        out=str(tmp_path / "out"),
    )
    report = evaluate(cfg, make_generator=lambda p: ScriptedPolicy(all_gold(world), wrong_share=0.3))
    names = list(report["results"]["base"]["single"])
    assert names[0] == "shapes:val-unseen" and "shapes:heldout" in names and "shapes:val" not in names
    counts = json.loads(report["paths"]["json"].read_text())["examples"]
    assert sum(n for name, n in counts.items() if name.startswith("shapes:val")) == len(load_shapes_task(world, "val"))
