"""Turn-level advantages (#35), checked on what the trainer receives and on the loss's gradient.

The later programs' own advantage (`repair_turn_advantage`): first-turn tokens keep the episode's
group-relative advantage, later program tokens get it plus the weight times the row's contrast within
its block (the rows sharing a first program). The first program's own credit (`repair_first_credit`):
its tokens get the group-relative advantage of its own reward (`own`), or that plus the episode's
(`both`), or none (`none`), the later ones the episode's. The later programs' fresh credit (`repair_later_credit`):
their tokens get the episode's reward less the mean reward of the group's other first programs.
Feedback tokens get no gradient, and each token's gradient scales with its own advantage."""

from __future__ import annotations

import pytest
import torch
from repair_trainer import _episode_layout, _final_norm_grads, _recipe, assets, scored_batch
from trl.trainer.utils import nanstd

from vprl.train.recipe.parsing import ConfigError
from vprl.train.repair.turn_advantage import fresh_advantages, group_advantages, turn_advantages

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


def test_first_turn_tokens_take_the_first_credit_where_given():
    advantages = torch.tensor([1.0, -1.0, 0.5])
    first = torch.tensor([-2.0, 3.0, 0.25])
    tool_mask = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 1], [1, 1, 1, 1]])
    got = turn_advantages(advantages, [0, 0, 2], tool_mask, 0.0, first)
    assert got.tolist() == [[-2.0, 1.0, 1.0, 1.0], [3.0, 3.0, -1.0, -1.0], [0.25, 0.25, 0.25, 0.25]]
    both = turn_advantages(advantages, [0, 0, 2], tool_mask, WEIGHT, first)
    assert both[0].tolist() == [-2.0, 1.0 + WEIGHT, 1.0 + WEIGHT, 1.0 + WEIGHT]  # block mean 0
    with pytest.raises(ValueError, match="3 advantages and \\(2,\\) first-turn"):
        turn_advantages(advantages, [0, 0, 2], tool_mask, 0.0, first[:2])


def test_later_tokens_take_the_later_credit_where_given():
    advantages = torch.tensor([1.0, -1.0, 0.5])
    later = torch.tensor([2.0, 0.0, -3.0])
    tool_mask = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 1], [1, 1, 1, 1]])
    got = turn_advantages(advantages, [0, 0, 2], tool_mask, 0.0, later=later)
    assert got.tolist() == [[1.0, 2.0, 2.0, 2.0], [-1.0, -1.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]]
    weighted = turn_advantages(advantages, [0, 0, 2], tool_mask, WEIGHT, later=later)
    assert weighted[0, 1:].tolist() == [2.0 + WEIGHT * 1.0] * 3  # the block's mean later credit is 1
    with pytest.raises(ValueError, match="3 advantages and \\(1,\\) later-turn"):
        turn_advantages(advantages, [0, 0, 2], tool_mask, 0.0, later=later[:1])


def test_fresh_advantages_set_the_final_against_the_groups_other_first_programs():
    nan = float("nan")
    finals = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, nan, 0.5])
    firsts = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, nan])
    blocks = torch.tensor([0, 1, 2, 3, 4, 4, 6, 6])  # the second group: two blocks of two rows
    got = fresh_advantages(finals, firsts, blocks, 4, "none")
    # Row 1: a wrong first program repaired, against the others' first programs (1, 0, 0): 1 - 1/3.
    assert torch.allclose(got[:4], torch.tensor([1.0 - 0.0, 1.0 - 1 / 3, 0.0 - 1 / 3, 1.0 - 1 / 3]))
    # Rows 4, 5 see only block 6's judged first program (0.5); block 6 sees block 4's; row 6 was never judged.
    assert got[4:].tolist() == [0.0, 0.0, 0.0, 0.0]
    pooled = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    scaled = fresh_advantages(finals, firsts, blocks, 4, "group")
    assert torch.allclose(scaled[:4], got[:4] / (pooled.std() + 1e-4))
    alone = fresh_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]), torch.tensor([0, 0]), 2, "group")
    assert alone.tolist() == [0.0, 0.0], "no first program outside the block: no baseline"
    with pytest.raises(ValueError, match="scale_rewards 'rank'"):
        fresh_advantages(finals, firsts, blocks, 4, "rank")


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_are_trls(scale):
    """The same numbers as trl 1.16's own advantage of summed rewards (written out here as its
    `_generate_and_score_completions` computes it), a reward never judged (NaN) left out and given 0."""
    rewards = torch.tensor([0.0, 1.0, 1.0, float("nan"), 0.2, 0.2, 0.2, 0.9])
    grouped = rewards.view(-1, 4)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(4)
    std = {"group": nanstd(grouped, dim=1).repeat_interleave(4), "batch": nanstd(rewards).expand(8)}.get(scale)
    want = rewards - mean if std is None else (rewards - mean) / (std + 1e-4)
    got = group_advantages(rewards, 4, scale)
    assert torch.allclose(got, torch.nan_to_num(want, nan=0.0))
    assert got[3] == 0 and got[4] != 0


def _spread_turns(totals: dict[str, float]):
    """`ProgramScorer.score` (the episode loop's path) with each program's total drawn from its text,
    as `_spread_totals` does for trl's reward functions: the first programs' own rewards differ."""
    import zlib

    from vprl.train.rollouts.scorer import ProgramScorer

    original = ProgramScorer.score

    def score(self, examples, programs, progress=False):
        scored = original(self, examples, programs, progress)
        spread = [zlib.crc32(b"turn" + p.encode()) % 89 / 89 for p in programs]
        totals.update(zip(programs, spread, strict=True))
        scored.rewards.totals[:] = spread
        return scored

    return score


@pytest.fixture(scope="module", params=["own", "both", "none"])
def credited(request, tmp_path_factory, assets):
    from vprl.train.rollouts.scorer import ProgramScorer

    firsts: dict[str, float] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ProgramScorer, "score", _spread_turns(firsts))
        for built, output, episodes, totals in scored_batch(
            tmp_path_factory.mktemp(f"first_credit_{request.param}"), assets, repair_first_credit=request.param
        ):
            yield request.param, built, output, episodes, totals, firsts


def test_the_trainer_receives_the_first_programs_own_credit(credited):
    credit, built, output, episodes, totals, firsts = credited
    assert built.trainer.repair_first_credit == credit
    group = built.trainer.num_generations

    def relative(values: list[float]) -> torch.Tensor:
        grouped = torch.tensor(values, dtype=torch.float32).view(-1, group)
        return ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()

    episode = relative([totals[e.final.program] for e in episodes])
    own = relative([firsts[e.first.program] for e in episodes])
    assert own.abs().sum() > 0 and not torch.allclose(own, episode, atol=1e-3), "nothing to tell apart"
    first_credit = {"own": own, "both": own + episode, "none": torch.zeros_like(own)}[credit]
    _assert_turn_credits(built, output, first_credit, episode)


def _assert_turn_credits(built, output, first: torch.Tensor, later: torch.Tensor) -> None:
    """Every row's first-turn tokens carry `first[row]`, its later program tokens `later[row]`."""
    advantages = output["advantages"]
    for row, (_, env) in enumerate(_episode_layout(output, built.trainer)):
        env = torch.tensor(env)
        opening = torch.cumsum(1 - env, 0) == 0
        assert (~opening).any(), "every episode of this recipe has two turns"
        got = advantages[row, : len(env)]
        assert torch.allclose(got[opening], first[row].expand(int(opening.sum())), atol=1e-4)
        assert torch.allclose(got[~opening], later[row].expand(int((~opening).sum())), atol=1e-4)


@pytest.fixture(scope="module")
def weighted(tmp_path_factory, assets):
    from vprl.train.rollouts.scorer import ProgramScorer

    firsts: dict[str, float] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ProgramScorer, "score", _spread_turns(firsts))
        yield from (
            (*batch, firsts)
            for batch in scored_batch(
                tmp_path_factory.mktemp("first_weight"), assets, repair_first_credit="own", repair_first_weight=0.25
            )
        )


def test_the_first_weight_scales_what_the_first_program_carries(weighted):
    """`repair_first_weight` w: the first program's tokens carry w times their own credit, the later
    ones are untouched; each token's gradient follows its advantage."""
    built, output, episodes, totals, firsts = weighted
    assert built.trainer.repair_first_weight == 0.25
    group = built.trainer.num_generations

    def relative(values: list[float]) -> torch.Tensor:
        grouped = torch.tensor(values, dtype=torch.float32).view(-1, group)
        return ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()

    own = relative([firsts[e.first.program] for e in episodes])
    assert own.abs().sum() > 0, "nothing to scale"
    _assert_turn_credits(built, output, 0.25 * own, relative([totals[e.final.program] for e in episodes]))
    _assert_gradients_follow(built, output)


def test_each_tokens_gradient_scales_with_its_first_credit(credited):
    _, built, output, _, _, _ = credited
    _assert_gradients_follow(built, output)


def _assert_gradients_follow(built, output) -> None:
    """The loss's gradient at each program token is its gradient under an advantage of 1, times its
    own advantage (at importance ratio 1 the loss is linear in the advantage); feedback tokens get none."""
    ones = dict(output, advantages=torch.ones_like(output["advantages"][:, 0]))
    with_turns, unit = _final_norm_grads(built, output), _final_norm_grads(built, ones)
    for row, (_, env) in enumerate(_episode_layout(output, built.trainer)):
        env = torch.tensor(env)
        got, plain = with_turns[row, : len(env)], unit[row, : len(env)]
        assert torch.all(got[env == 0] == 0), "a feedback token's logits got a gradient"
        program = env == 1
        scale = output["advantages"][row, : len(env)].abs()
        assert torch.allclose(got[program], plain[program] * scale[program], rtol=1e-4, atol=1e-9)


@pytest.fixture(scope="module")
def freshly(tmp_path_factory, assets):
    from vprl.train.rollouts.scorer import ProgramScorer

    firsts: dict[str, float] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ProgramScorer, "score", _spread_turns(firsts))
        for built, output, episodes, totals in scored_batch(
            tmp_path_factory.mktemp("later_credit"), assets, repair_later_credit="fresh"
        ):
            yield built, output, episodes, totals, firsts


def test_the_trainer_receives_the_later_programs_fresh_credit(freshly):
    """Written out per group: a row's final reward less the mean of the other rows' first rewards,
    over the std of the group's first and final rewards together."""
    built, output, episodes, totals, firsts = freshly
    assert built.trainer.repair_later_credit == "fresh"
    group = built.trainer.num_generations
    finals = [totals[e.final.program] for e in episodes]
    opening = [firsts[e.first.program] for e in episodes]
    expected, episode = [], []
    for g in range(0, len(episodes), group):
        rows = range(g, g + group)
        spread = torch.tensor([opening[j] for j in rows] + [finals[j] for j in rows]).std()
        own = torch.tensor([finals[j] for j in rows])
        episode += ((own - own.mean()) / (own.std() + 1e-4)).tolist()
        for i in rows:
            baseline = sum(opening[j] for j in rows if j != i) / (group - 1)
            expected.append((finals[i] - baseline) / (float(spread) + 1e-4))
    assert not torch.allclose(torch.tensor(expected), torch.tensor(episode), atol=1e-3), "nothing to tell apart"
    _assert_turn_credits(built, output, torch.tensor(episode), torch.tensor(expected))


def test_each_tokens_gradient_scales_with_its_later_credit(freshly):
    built, output, _, _, _ = freshly
    _assert_gradients_follow(built, output)


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
    advantages = output["advantages"]
    assert (advantages != advantages[:, :1]).any(), "no row's later tokens got an advantage of their own"
    _assert_gradients_follow(built, output)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"repair_turn_advantage": -1.0, "repair_branches": 2}, "must be >= 0, got -1"),
        ({"repair_turn_advantage": 1.0}, "needs repair_branches of 2 or more"),
        ({"repair_turn_advantage": 1.0, "repair_branches": 2, "algorithm": "rloo"}, "for grpo"),
        ({"repair_turn_advantage": 1.0, "repair_max_turns": 1}, "needs repair episodes"),
        ({"repair_first_credit": "last"}, "'last' is not one of episode, own, both, none"),
        ({"repair_first_credit": "own", "algorithm": "rloo"}, "own is for grpo"),
        ({"repair_first_credit": "both", "repair_max_turns": 1}, "needs repair episodes"),
        ({"repair_first_credit": "own", "filter_zero_variance": True}, "set filter_zero_variance: false"),
        ({"repair_later_credit": "best"}, "'best' is not one of episode, fresh"),
        ({"repair_later_credit": "fresh", "algorithm": "rloo"}, "fresh is for grpo"),
        ({"repair_later_credit": "fresh", "repair_max_turns": 1}, "needs repair episodes"),
        ({"repair_later_credit": "fresh", "filter_zero_variance": True}, "set filter_zero_variance: false"),
        ({"repair_later_credit": "fresh", "repair_branches": 4}, "num_generations 4 must exceed repair_branches 4"),
        ({"repair_first_weight": -0.5}, "must be >= 0, got -0.5"),
        ({"repair_first_weight": 0.5, "algorithm": "rloo"}, "for grpo"),
        ({"repair_first_weight": 0.5, "repair_max_turns": 1}, "needs repair episodes"),
    ],
)
def test_bad_turn_advantages_are_refused_naming_the_key(tmp_path, assets, values, message):
    from vprl.train.recipe.checks import validate
    from vprl.train.recipe.rl_config import parse_rl_config

    keys = ("repair_turn_advantage", "repair_first_credit", "repair_later_credit", "repair_first_weight")
    key = next(k for k in values if k in keys)
    with pytest.raises(ConfigError, match=f"{key}: .*{message}"):
        validate(parse_rl_config(["--config", str(_recipe(tmp_path, assets, **values))]))
