"""Turn-level groups (`repair_branches`, #35): a group's rows share a sampled first program in blocks,
and each row writes its own second program from it and its feedback. Checked on what the trainer
receives: the block's rows hold the same first-turn tokens and feedback, their own second programs,
each row's advantage is its own final program's group-relative reward (so within a block only the
second programs tell the rows apart), the feedback gets no gradient, and the importance ratios are 1
with the first program's sampling log-probabilities copied to every row of its block."""

from __future__ import annotations

import pytest
import torch
from repair_trainer import (
    _episode_layout,
    _recipe,
    assert_no_feedback_gradient,
    assert_vllm_ratios_one,
    assets,
    built_on_fake_vllm,
    scored_batch,
)

from vprl.train.recipe.parsing import ConfigError
from vprl.train.repair.trl_rollout import branch_sources

__all__ = ["assets"]  # the module fixture

BRANCHES = 2


def test_branch_sources_share_each_questions_rows_in_blocks():
    assert branch_sources(["a", "a", "b", "b", "a", "a"], 2) == [0, 0, 2, 2, 4, 4]
    assert branch_sources(["a", "a", "a", "a"], 4) == [0, 0, 0, 0]
    assert branch_sources(["a", "b", "a"], 1) == [0, 1, 2]
    with pytest.raises(ValueError, match="question 'b' has 1 rows"):
        branch_sources(["a", "a", "b"], 2)


def _blocks(output, built, episodes):
    layout = _episode_layout(output, built.trainer)
    return [(layout[i : i + BRANCHES], episodes[i : i + BRANCHES]) for i in range(0, len(layout), BRANCHES)]


@pytest.fixture(scope="module")
def branched(tmp_path_factory, assets):
    yield from scored_batch(tmp_path_factory.mktemp("branched"), assets, repair_branches=BRANCHES)


def test_a_blocks_rows_share_the_first_program_and_write_their_own_second(branched):
    built, output, episodes, _ = branched
    assert len(episodes) == 16 and all(len(e.turns) == 2 for e in episodes)
    assert [e.shared_first for e in episodes] == [False, True] * 8
    differ = 0
    for rows, block in _blocks(output, built, episodes):
        (ids_a, env_a), (ids_b, env_b) = rows
        end = env_a.index(0)
        second = end + env_a[end:].index(1)
        assert env_b.index(0) == end and ids_a[:second] == ids_b[:second]  # same first program, same feedback
        assert block[0].first == block[1].first and block[0].example_id == block[1].example_id
        differ += ids_a[second:] != ids_b[second:]
    assert differ, "every block's second programs came out the same: they were not sampled per row"


def test_each_rows_advantage_is_its_own_final_programs(branched):
    built, output, episodes, totals = branched
    finals = torch.tensor([totals[e.final.program] for e in episodes], dtype=torch.float32)
    grouped = finals.view(-1, built.trainer.num_generations)
    expected = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
    assert torch.allclose(output["advantages"], expected.flatten(), atol=1e-5)
    # within a block the first program and its feedback are one: the advantages differ by the second programs
    contrasts = [
        (float(output["advantages"][i]), float(output["advantages"][i + 1]))
        for i in range(0, len(episodes), BRANCHES)
        if episodes[i].final.program != episodes[i + 1].final.program
    ]
    assert contrasts and any(a != b for a, b in contrasts)
    assert_no_feedback_gradient(built, output, _episode_layout(output, built.trainer))


def test_importance_ratios_are_one_with_the_first_programs_log_probabilities_copied(tmp_path, assets, monkeypatch):
    from fake_vllm import PolicyVLLMGeneration

    built = built_on_fake_vllm(tmp_path, assets, monkeypatch, repair_branches=BRANCHES)
    try:
        output = built.batch()
        (engine,) = PolicyVLLMGeneration.instances
        # the first turn drew one program per block: 16 rows, 8 first programs, then one per second turn
        assert len(engine.prompts) == 8 + 16
        assert_vllm_ratios_one(built, output)
    finally:
        built.close()


def test_rloo_shares_first_programs_in_blocks_too(tmp_path, assets):
    batches = scored_batch(tmp_path, assets, algorithm="rloo", repair_branches=BRANCHES)
    built, output, episodes, totals = next(batches)
    batches.close()  # the executor
    assert [e.shared_first for e in episodes] == [False, True] * 8
    for i in range(0, len(episodes), BRANCHES):
        rows = []
        for ids, mask, env in zip(
            output["completion_ids"][i : i + 2], output["completion_mask"][i : i + 2], output["env_mask"][i : i + 2]
        ):
            n = int(mask.sum())
            env = env[:n].tolist()
            second = env.index(0) + env[env.index(0) :].index(1)
            rows.append(ids[:second].tolist())
        assert rows[0] == rows[1]
    # RLOO's leave-one-out advantage, each row from its own final program
    rewards = torch.tensor([totals[e.final.program] for e in episodes]).view(-1, built.trainer.num_generations)
    baseline = (rewards.sum(1, keepdim=True) - rewards) / (built.trainer.num_generations - 1)
    expected = (rewards - baseline).flatten()
    if built.trainer.normalize_advantages:
        expected = (expected - expected.mean()) / (expected.std() + 1e-4)
    assert torch.allclose(output["advantages"], expected, atol=1e-5)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"repair_branches": 3}, "does not divide num_generations 4"),
        ({"repair_branches": 0}, "must be at least 1"),
        ({"repair_branches": 2, "algorithm": "rest"}, "ReST samples its episodes itself"),
    ],
)
def test_bad_branches_are_refused_naming_the_key(tmp_path, assets, values, message):
    from vprl.train.recipe.checks import validate
    from vprl.train.recipe.rl_config import parse_rl_config

    cfg = parse_rl_config(["--config", str(_recipe(tmp_path, assets, **values))])
    with pytest.raises(ConfigError, match=f"repair_branches: .*{message}"):
        validate(cfg)
