"""Replayed repair pairs (`repair_replay_weight`, vprl/train/repair/replay.py): what the trainer
receives (each carrying row's ids and target mask, as trl's SFT tokenized the pair) and the loss and
its gradient (trl's GRPO loss plus W times the replayed targets' mean NLL)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from repair_trainer import _Built, _recipe, assets

from vprl.train.bootstrap.pairs import SFTPair
from vprl.train.bootstrap.repair_pairs import REPAIR_PAIRS_FILE, load_repair_pairs
from vprl.train.recipe.parsing import ConfigError
from vprl.train.repair.guide import guide_nll
from vprl.train.repair.replay import REPLAY_IDS, REPLAY_MASK, replay_batch, replay_rows, tokenize_pair

__all__ = ["assets"]  # the shared fixture, imported for pytest
WEIGHT, ROWS = 0.7, 5
FEEDBACK = '\n# Feedback on the program above:\n# It returned "no".\n# Write the function again, fixing what the feedback shows.\n'


def _pairs(prompts: list[str]) -> list[SFTPair]:
    """Repair pairs shaped as the bootstrap writes them: a prompt, a wrong body, a feedback block and
    the opener again; the completion a body."""
    return [
        SFTPair(
            example_id=f"q{i}",
            family="exists",
            kind="repair:mutation",
            prompt=p + "\n    return 'no'" + FEEDBACK + p.rsplit("\n#", 1)[-1].lstrip("\n"),
            completion=f"\n    image_patch = ImagePatch(image)\n    return '{'yes' if i % 2 else 'no'}'\n",
        )
        for i, p in enumerate(prompts)
    ]


def _write(path, pairs: list[SFTPair]) -> None:
    path.write_text("".join(json.dumps(p.to_json()) + "\n" for p in pairs), encoding="utf-8")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory, assets):
    folder = tmp_path_factory.mktemp("replayed")
    pairs_path = folder / REPAIR_PAIRS_FILE
    # the pool needs the prompts the trainer writes: build once without replay to read them
    _write(pairs_path, _pairs(["# Is there a red circle?\ndef execute_command(image) -> str:"]))
    recipe = _recipe(
        folder,
        assets,
        repair_replay_weight=WEIGHT,
        repair_replay_pairs=str(pairs_path),
        repair_replay_rows=ROWS,
    )
    built = _Built(recipe)
    pool = _pairs([built.trainer.train_dataset[i]["prompt"] for i in range(6)])
    built.trainer.set_replay_pairs(pool, seed=0)
    try:
        torch.manual_seed(0)
        yield built, built.batch(), pool
    finally:
        built.close()


def test_pairs_tokenize_as_trls_sft_does(tmp_path, assets):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    _, policy = assets
    tokenizer = AutoTokenizer.from_pretrained(policy)
    pairs = _pairs(["# Is there a red circle?\ndef execute_command(image) -> str:", "# How many squares?\ndef f():"])
    data = Dataset.from_list([{"prompt": p.prompt, "completion": p.completion} for p in pairs])
    args = SFTConfig(
        output_dir=str(tmp_path), completion_only_loss=True, max_length=4096, report_to="none", use_cpu=True
    )
    sft = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(policy), args=args, train_dataset=data, processing_class=tokenizer
    )
    for pair, row in zip(pairs, sft.train_dataset, strict=True):
        ids, k = tokenize_pair(pair, tokenizer)
        assert ids == row["input_ids"]
        # trl folds its completion mask into the labels: -100 off the target
        assert [-100] * (len(ids) - k) + ids[len(ids) - k :] == row["labels"]


def test_the_rows_that_carry_a_pair_hold_it_as_sft_saw_it(replayed):
    built, output, pool = replayed
    ids, mask = output[REPLAY_IDS], output[REPLAY_MASK]
    batch = output["completion_ids"].size(0)
    assert ids.shape[0] == batch == mask.shape[0]
    carriers = replay_rows(batch, ROWS)
    assert len(carriers) == ROWS
    expected = [tokenize_pair(p, built.trainer.processing_class) for p in pool]
    seen = []
    for row in range(batch):
        if row not in carriers:
            assert mask[row].sum() == 0
            continue
        n = int(mask[row].nonzero().max()) + 1
        got = (ids[row, :n].tolist(), int(mask[row].sum()))
        assert got in expected
        assert mask[row, n - got[1] : n].all()  # the target is the sequence's tail
        seen.append(expected.index(got))
    assert len(set(seen)) == ROWS  # drawn without replacement while the pool lasts (6 pairs here)


def test_more_rows_than_pairs_draw_again_and_every_row_at_most_once():
    pool = [([1, 2, 3], 1), ([4, 5], 1)]
    ids, mask = replay_batch(pool, batch=6, rows=10, rng=np.random.default_rng(0), pad_id=0)
    assert mask.sum(1).tolist() == [1] * 6  # rows capped at the batch: every row carries one
    assert replay_rows(8, 3) == [0, 2, 5]


def test_the_loss_is_trls_plus_the_weighted_replay_and_so_is_its_gradient(replayed):
    built, output, _ = replayed
    trainer = built.trainer
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # set by trl's loop
    plain_inputs = {k: v for k, v in output.items() if k not in (REPLAY_IDS, REPLAY_MASK)}
    params = [p for p in trainer.model.parameters() if p.requires_grad]

    def grads(inputs: dict | None) -> tuple[float, list[torch.Tensor]]:
        trainer.model.zero_grad()
        if inputs is None:  # the replay term alone
            loss = guide_nll(trainer.model, output[REPLAY_IDS], output[REPLAY_MASK])
        else:
            loss = trainer.compute_loss(trainer.model, inputs)
        loss.backward()
        return float(loss), [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]

    plain, g_plain = grads(plain_inputs)
    with_replay, g_with = grads(output)
    nll, g_nll = grads(None)
    assert nll > 0 and float(with_replay) == pytest.approx(plain + WEIGHT * nll, rel=1e-5, abs=1e-6)
    for a, b, c in zip(g_with, g_plain, g_nll, strict=True):
        torch.testing.assert_close(a, b + WEIGHT * c, rtol=1e-4, atol=1e-6)
    assert any(float(c.abs().max()) > 0 for c in g_nll)  # the replay does move the policy
    assert trainer._metrics["train"]["repair/replay_nll"]


def test_the_saved_pairs_load_and_a_bad_line_is_named(tmp_path):
    path = tmp_path / REPAIR_PAIRS_FILE
    pairs = _pairs(["# q?\ndef f():"])
    _write(path, pairs)
    assert load_repair_pairs(path) == pairs
    path.write_text(path.read_text() + '{"prompt": 1}\n')
    with pytest.raises(ValueError, match=f"{REPAIR_PAIRS_FILE}:2: not a repair pair"):
        load_repair_pairs(path)


@pytest.mark.parametrize(
    ("values", "key", "message"),
    [
        ({"repair_replay_weight": 0.5, "algorithm": "rloo"}, "repair_replay_weight", "rloo is not supported"),
        ({"repair_replay_weight": 0.5, "repair_max_turns": 1}, "repair_replay_weight", "needs repair episodes"),
        (
            {"repair_replay_weight": 0.5, "repair_replay_pairs": "/nowhere/p.jsonl"},
            "repair_replay_pairs",
            "not a file",
        ),
        ({"repair_replay_weight": 0.5, "repair_replay_rows": 0}, "repair_replay_rows", "at least 1"),
    ],
)
def test_bad_replay_settings_are_refused_naming_the_key(tmp_path, assets, values, key, message):
    from vprl.train.recipe.checks import validate
    from vprl.train.recipe.rl_config import parse_rl_config

    if "repair_replay_pairs" not in values:
        _write(tmp_path / "pairs.jsonl", _pairs(["# q?\ndef f():"]))
        values = {**values, "repair_replay_pairs": str(tmp_path / "pairs.jsonl")}
    with pytest.raises(ConfigError, match=f"{key}: .*{message}"):
        validate(parse_rl_config(["--config", str(_recipe(tmp_path, assets, **values))]))
