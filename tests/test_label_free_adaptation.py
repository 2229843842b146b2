"""Label-free adaptation: a recipe entry with `labels: false` (or `dataset_labels: false`) trains on its
questions with the answers withheld at load time. A sentinel answer planted in the world's question
files must appear in the examples a labelled load gives (so the check can fail), and never in what a
label-free run's rewards are handed nor anywhere in its run folder."""

import json
from pathlib import Path

import pytest
import yaml
from rl_tiny import RECIPE_BASE, build_policy

from vprl.data.shapes import BuildConfig, build_dataset
from vprl.rewards.registry import register
from vprl.train.recipe.data import load_examples
from vprl.train.recipe.mixture import ENTRY_META, UNLABELED_META, has_labels
from vprl.train.recipe.sections import DataArgs

REPO = Path(__file__).resolve().parents[1]
SENTINEL = "zq-sentinel-answer-7731"
SPY = "label_spy_for_tests"
ENTRIES = [
    {"name": "vqa", "dataset": "shapes", "tasks": ["train"], "labels": False},
    {"name": "heldout", "dataset": "shapes", "tasks": ["heldout"], "labels": False},
    {"name": "itm", "dataset": "shapes", "tasks": ["winoground", "sugarcrepe"], "labels": False},
]


def _spy(path: str):
    """A reward that writes down every example it is handed and has nothing to say about any."""

    def score(examples, results, programs):
        with open(path, "a", encoding="utf-8") as f:
            for ex in examples:
                f.write(json.dumps(ex.to_json()) + "\n")
        return [None] * len(examples)

    return score


register(SPY, _spy)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A shapes world whose question files answer every question with the sentinel."""
    root = tmp_path_factory.mktemp("label_free") / "world"
    build_dataset(
        BuildConfig(out=str(root), workers=1, train=16, val=6, winoground=2, sugarcrepe=1, refcoco=2, seed=5)
    )
    for name in ("train", "testdev"):
        path = root / "gqa" / f"{name}_balanced_questions.json"
        rows = json.loads(path.read_text())
        for row in rows.values():
            row["answer"], row["fullAnswer"] = SENTINEL, f"The answer is {SENTINEL}."
        path.write_text(json.dumps(rows))
    return root


def _args(world, **values) -> DataArgs:
    return DataArgs(dataset_root=str(world), **values)


def test_the_sentinel_is_in_the_labelled_examples(world):
    examples = load_examples(_args(world, dataset_tasks=["train", "heldout"]))
    assert examples and all(ex.answers == (SENTINEL,) for ex in examples)
    assert all(SENTINEL in json.dumps(ex.to_json()) for ex in examples)


def test_a_label_free_load_keeps_no_label(world):
    flat = load_examples(_args(world, dataset_tasks=["train", "heldout"], dataset_labels=False))
    mixed = load_examples(_args(world, dataset_mixture={"datasets": ENTRIES}))
    itm = load_examples(_args(world, dataset_tasks=["winoground", "sugarcrepe"]))
    assert {"polarity", "image_index", "caption_index"} <= {k for ex in itm for k in ex.meta}  # what must go
    for ex in flat + mixed:
        assert not has_labels(ex) and SENTINEL not in json.dumps(ex.to_json())
        assert set(ex.meta) <= UNLABELED_META | {ENTRY_META}, sorted(ex.meta)
        assert not any(tag in ex.id for tag in ("-pos", "-neg", "-i0-", "-i1-")), ex.id
    assert {ex.meta[ENTRY_META] for ex in mixed} == {"vqa", "heldout", "itm"}
    assert len({ex.id for ex in flat}) == len(flat)  # the opaque ids stay distinct


def test_a_label_free_run_never_reads_the_answers(tmp_path, world):
    from vprl.train.rl import main
    from vprl.train.rollouts.log import RolloutLog

    policy = build_policy(tmp_path / "policy", world)
    spy = tmp_path / "reward_inputs.jsonl"
    run = tmp_path / "run"
    recipe = {**RECIPE_BASE, "per_device_train_batch_size": 16, "max_steps": 2}
    recipe.pop("dataset"), recipe.pop("dataset_tasks")
    recipe.update(
        model_name_or_path=str(policy),
        dataset_root=str(world),
        dataset_mixture={"seed": 1, "datasets": [{**ENTRIES[0], "weight": 3.0}, *ENTRIES[1:]]},
        tool_stack="shapes",
        output_dir=str(run),
        rewards=[
            {
                "name": "unit_tests",
                "settings": {"num_tests": 2, "sampler": "balanced", "cache_dir": str(tmp_path / "ut")},
            },
            {"name": SPY, "settings": {"path": str(spy)}},
        ],
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    main(["--config", str(path)])

    handed = [json.loads(line) for line in spy.read_text().splitlines()]
    assert handed, "no program ran, so the rewards were handed nothing to check"
    for row in handed:
        assert row["answers"] == [] and row["box"] is None and SENTINEL not in json.dumps(row)
        assert set(row["meta"]) <= UNLABELED_META | {ENTRY_META}
    assert RolloutLog.in_run(run).read()
    leaks = [p for p in run.rglob("*") if p.is_file() and SENTINEL.encode() in p.read_bytes()]
    assert leaks == []
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["dataset"]["labels"] is False
    assert all(not e["labels"] for e in manifest["dataset"]["mixture"]["datasets"])
