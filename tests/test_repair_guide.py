"""Guided second turns (`repair_guide_weight`, #35), checked on what the trainer receives and on its
loss: each wrong first program that got feedback is followed, in its own context, by a right final
program of its question from the same batch (that row's sampled tokens), the mask covers those tokens
only, the term is their mean NLL exactly, and the loss is trl's plus the weighted term."""

from __future__ import annotations

import pytest
import torch
from repair_trainer import _Built, _episode_layout, _recipe, assets

from vprl.rewards.feedback import Feedback
from vprl.train.recipe.parsing import ConfigError
from vprl.train.repair.episode import Episode, Turn
from vprl.train.repair.guide import GUIDE_IDS, GUIDE_MASK, guide_nll, guide_targets

__all__ = ["assets"]  # the module fixture

WEIGHT = 0.5


def _episode(q: str, first: bool, final: bool | None = None, labelled: bool = True) -> Episode:
    def turn(right: bool, feedback: Feedback | None = None) -> Turn:
        components = {"correctness": float(right)} if labelled else {}
        return Turn("p", "ok", components=components, passed=right, feedback=feedback)

    if final is None:
        return Episode(q, (turn(first),))
    return Episode(q, (turn(first, Feedback(("error",), "It failed")), turn(final)))


@pytest.mark.parametrize("labelled", [True, False])
def test_each_wrong_first_program_is_guided_by_a_right_final_program_of_its_question(labelled):
    episodes = [
        _episode("a", False, False, labelled),  # 0: guided by row 1
        _episode("a", True, None, labelled),  # 1: right at once: the guide, not guided
        _episode("a", False, True, labelled),  # 2: repaired itself; guided by row 1 (not its own)
        _episode("b", False, False, labelled),  # 3: no row of b ended right
        _episode("c", False, True, labelled),  # 4: its own final is c's only right one: nothing else to show
    ]
    assert guide_targets(episodes) == [1, None, 1, None, None]


def test_a_row_masked_out_whole_neither_is_guided_nor_guides():
    from vprl.train.repair.guide import guide_batch

    episodes = [_episode("a", False, False), _episode("a", False, True), _episode("a", False, True)]
    prompt = torch.tensor([[5, 6]] * 3)
    completion = torch.tensor([[1, 2, 9, 3, 4]] * 3)
    env = torch.tensor([[1, 1, 0, 1, 1]] * 3)
    mask = torch.ones_like(completion)
    mask[1] = 0  # row 1 cut at the length limit and masked by the trainer
    ids, guide = guide_batch(episodes, prompt, torch.ones_like(prompt), completion, mask, env, pad_id=0)
    assert guide[1].sum() == 0  # not guided
    # row 0 is guided by row 2 (row 1, masked, cannot guide): its context, then row 2's final program
    assert ids[0].tolist() == [5, 6, 1, 2, 9, 3, 4] and guide[0].tolist() == [0, 0, 0, 0, 0, 1, 1]
    assert guide_targets(episodes) == [1, 2, 1]  # by the episodes alone row 1 would guide
    assert guide_targets(episodes, [True, False, True]) == [2, None, None]


@pytest.fixture(scope="module")
def guided(tmp_path_factory, assets):
    """One generation batch of the guided recipe where every second program is "right" and a first
    program by a hash of its text: the test policy's programs are seldom right, and a batch without
    a right final program has no guide."""
    import zlib

    from vprl.train.rollouts.scorer import ProgramScorer

    built = _Built(_recipe(tmp_path_factory.mktemp("guided"), assets, repair_guide_weight=WEIGHT))
    original = ProgramScorer.score

    calls = []

    def score(self, examples, programs, progress=False):
        scored = original(self, examples, programs, progress)
        later = bool(calls)  # the loop scores each turn's programs in one call
        calls.append(len(programs))
        scored.rewards.components["correctness"] = [float(later or zlib.crc32(p.encode()) % 3 == 0) for p in programs]
        return scored

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ProgramScorer, "score", score)
            torch.manual_seed(0)
            output = built.batch()
        yield built, output, built.trainer.rollout_func.last_episodes
    finally:
        built.close()


def test_the_guide_is_the_rows_own_context_then_a_right_final_program_as_sampled(guided):
    built, output, episodes = guided
    layout = _episode_layout(output, built.trainer)
    sources = guide_targets(episodes)
    ids, mask = output[GUIDE_IDS], output[GUIDE_MASK]
    assert any(s is not None for s in sources), "no row was guided in this batch: nothing to check"
    for row, source in enumerate(sources):
        if source is None:
            assert mask[row].sum() == 0
            continue
        assert episodes[source].example_id == episodes[row].example_id and episodes[source].final.right()
        assert not episodes[row].first.right()
        prompt = output["prompt_ids"][row][output["prompt_mask"][row].bool()].tolist()
        own, env = layout[row]
        second = env.index(0) + env[env.index(0) :].index(1)
        src_ids, src_env = layout[source]
        last = max(i for i, v in enumerate(src_env) if v == 0) + 1 if 0 in src_env else 0
        target = src_ids[last:]
        expected = prompt + own[:second] + target
        n = len(expected)
        assert ids[row, :n].tolist() == expected
        assert mask[row].tolist() == [0] * (n - len(target)) + [1] * len(target) + [0] * (mask.size(1) - n)
    assert built.trainer._metrics["train"]["repair/guided_share"]


def test_the_guide_term_is_the_mean_nll_of_the_guiding_tokens(guided):
    built, output, _ = guided
    model = built.trainer.model
    ids, mask = output[GUIDE_IDS], output[GUIDE_MASK]
    with torch.no_grad():
        got = guide_nll(model, ids, mask)
        total, count = 0.0, 0
        for row in range(ids.size(0)):  # one unpadded forward per guided row
            where = mask[row].nonzero().flatten().tolist()
            if not where:
                continue
            seq = ids[row, : where[-1] + 1].unsqueeze(0)
            logp = torch.log_softmax(model(input_ids=seq).logits[0, :-1].float(), -1)
            total -= sum(float(logp[p - 1, seq[0, p]]) for p in where)
            count += len(where)
    assert got is not None and float(got) == pytest.approx(total / count, rel=1e-5)
    assert guide_nll(model, ids, torch.zeros_like(mask)) is None


def test_the_loss_is_trls_plus_the_weighted_guide(guided):
    built, output, _ = guided
    trainer = built.trainer
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # set by trl's loop
    with torch.no_grad():
        plain = trainer.compute_loss(
            trainer.model, {k: v for k, v in output.items() if k not in (GUIDE_IDS, GUIDE_MASK)}
        )
        with_guide = trainer.compute_loss(trainer.model, output)
        nll = guide_nll(trainer.model, output[GUIDE_IDS], output[GUIDE_MASK])
    assert float(with_guide) == pytest.approx(float(plain) + WEIGHT * float(nll), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"repair_guide_weight": -1.0}, "must be >= 0"),
        ({"repair_guide_weight": 0.5, "algorithm": "rloo"}, "rloo is not supported"),
        ({"repair_guide_weight": 0.5, "repair_max_turns": 1}, "needs repair episodes"),
    ],
)
def test_bad_guide_settings_are_refused_naming_the_key(tmp_path, assets, values, message):
    from vprl.train.recipe.checks import validate
    from vprl.train.recipe.rl_config import parse_rl_config

    with pytest.raises(ConfigError, match=f"repair_guide_weight: .*{message}"):
        validate(parse_rl_config(["--config", str(_recipe(tmp_path, assets, **values))]))
