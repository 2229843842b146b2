"""The later programs' own advantage (`repair_turn_advantage`, #35), checked on what the trainer
receives and on the loss's gradient: first-turn tokens keep the episode's group-relative advantage,
later program tokens get it plus the weight times the row's contrast within its block (the rows
sharing a first program), feedback tokens get no gradient, and each token's gradient scales with
its own advantage."""

from __future__ import annotations

import pytest
import torch
from repair_trainer import _episode_layout, _final_norm_grads, _recipe, assets, scored_batch

from vprl.train.recipe.parsing import ConfigError
from vprl.train.repair.turn_advantage import turn_advantages

__all__ = ["assets"]  # the module fixture

BRANCHES = 2
WEIGHT = 1.5


def test_turn_advantages_add_the_blocks_contrast_on_later_tokens_only():
    advantages = torch.tensor([1.0, -1.0, 0.5, 0.5, 2.0])
    sources = [0, 0, 2, 2, 4]
    tool_mask = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 1], [1, 0, 1, 1], [1, 1, 1, 1], [1, 0, 1, 1]])
    got = turn_advantages(advantages, sources, tool_mask, WEIGHT)
    assert got.tolist() == [
        [1.0, 1.0 + WEIGHT, 1.0 + WEIGHT, 1.0 + WEIGHT],  # block mean 0: the later tokens gain w * 1
        [-1.0, -1.0, -1.0 - WEIGHT, -1.0 - WEIGHT],  # its first feedback token at position 2
        [0.5, 0.5, 0.5, 0.5],  # a block of equal rewards: no contrast
        [0.5, 0.5, 0.5, 0.5],  # one turn: first-turn tokens throughout
        [2.0, 2.0, 2.0, 2.0],  # a block of one row
    ]
    with pytest.raises(ValueError, match="5 advantages, 4 block sources"):
        turn_advantages(advantages, sources[:4], tool_mask, WEIGHT)


@pytest.fixture(scope="module")
def turned(tmp_path_factory, assets):
    yield from scored_batch(
        tmp_path_factory.mktemp("turn_advantage"),
        assets,
        repair_branches=BRANCHES,
        repair_turn_advantage=WEIGHT,
    )


def _expected(built, episodes, totals) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's group-relative advantage from its final program's total, and its block's mean."""
    finals = torch.tensor([totals[e.final.program] for e in episodes], dtype=torch.float32)
    grouped = finals.view(-1, built.trainer.num_generations)
    rows = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()
    return rows, rows.view(-1, BRANCHES).mean(1).repeat_interleave(BRANCHES)


def test_the_trainer_receives_the_turns_own_advantages(turned):
    built, output, episodes, totals = turned
    assert built.trainer.repair_turn_advantage == WEIGHT
    rows, block_mean = _expected(built, episodes, totals)
    advantages = output["advantages"]
    assert advantages.shape == output["completion_ids"].shape
    contrasted = 0
    for row, (_, env) in enumerate(_episode_layout(output, built.trainer)):
        env = torch.tensor(env)
        first = torch.cumsum(1 - env, 0) == 0
        got = advantages[row, : len(env)]
        assert torch.allclose(got[first], rows[row].expand(int(first.sum())), atol=1e-5)
        later = rows[row] + WEIGHT * (rows[row] - block_mean[row])
        assert torch.allclose(got[~first], later.expand(int((~first).sum())), atol=1e-5)
        contrasted += bool((~first).any()) and abs(float(rows[row] - block_mean[row])) > 1e-3
    assert contrasted, "no block's second programs differed in reward: nothing was checked"


def test_each_tokens_gradient_scales_with_its_own_advantage(turned):
    built, output, _, _ = turned
    per_row = dict(output, advantages=output["advantages"][:, 0].clone())  # the first token: the episode's own
    with_turns, without = _final_norm_grads(built, output), _final_norm_grads(built, per_row)
    checked = 0
    for row, (_, env) in enumerate(_episode_layout(output, built.trainer)):
        a_row = float(per_row["advantages"][row])
        if abs(a_row) < 1e-3:
            continue
        env = torch.tensor(env)
        got, plain = with_turns[row, : len(env)], without[row, : len(env)]
        assert torch.all(got[env == 0] == 0), "a feedback token's logits got a gradient"
        scale = output["advantages"][row, : len(env)].abs() / abs(a_row)
        program = env == 1
        assert torch.allclose(got[program], plain[program] * scale[program], rtol=1e-4, atol=1e-9)
        checked += int((scale[program] != 1).any())
    assert checked, "no row's later tokens got an advantage of their own"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"repair_turn_advantage": -1.0, "repair_branches": 2}, "must be >= 0, got -1"),
        ({"repair_turn_advantage": 1.0}, "needs repair_branches of 2 or more"),
        ({"repair_turn_advantage": 1.0, "repair_branches": 2, "algorithm": "rloo"}, "for grpo"),
        ({"repair_turn_advantage": 1.0, "repair_max_turns": 1}, "needs repair episodes"),
    ],
)
def test_bad_turn_advantages_are_refused_naming_the_key(tmp_path, assets, values, message):
    from vprl.train.recipe.checks import validate
    from vprl.train.recipe.rl_config import parse_rl_config

    with pytest.raises(ConfigError, match=f"repair_turn_advantage: .*{message}"):
        validate(parse_rl_config(["--config", str(_recipe(tmp_path, assets, **values))]))
