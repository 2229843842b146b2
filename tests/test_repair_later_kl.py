"""The KL to the reference on the later turns only (`repair_kl_turns: later`, #35), checked on the
loss's gradient: first-turn program tokens get the policy-gradient term alone (exactly what they
get without a KL), later-turn program tokens get the KL too, feedback tokens get nothing, and the
batch trl keeps is left as it was."""

from __future__ import annotations

import pytest
import torch
from repair_trainer import _episode_layout, _final_norm_grads, _recipe, assets, scored_batch

from vprl.train.recipe.parsing import ConfigError
from vprl.train.repair.later_kl import REF, first_turn_mask

__all__ = ["assets"]  # the module fixture

BETA = 0.5


def test_first_turn_mask_ends_at_each_rows_first_feedback_token():
    tool_mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 1, 1]])
    assert first_turn_mask(tool_mask).int().tolist() == [[1, 1, 0, 0, 0, 0], [1] * 6, [0] * 6]


@pytest.fixture(scope="module")
def later(tmp_path_factory, assets):
    batches = scored_batch(tmp_path_factory.mktemp("later_kl"), assets, beta=BETA, repair_kl_turns="later")
    built, output, episodes, _ = next(batches)
    # A new adapter is the reference itself (KL 0, no gradient): move it off the reference.
    torch.manual_seed(1)
    for name, param in built.trainer.model.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0.0, 0.05)
    yield built, output, episodes
    batches.close()


def _grads(built, output, later_only: bool, beta: float = BETA, advantages: bool = True) -> torch.Tensor:
    trainer = built.trainer
    saved = trainer.kl_later_turns_only, trainer.beta
    trainer.kl_later_turns_only, trainer.beta = later_only, beta
    batch = dict(output)
    if not advantages:  # the KL term alone
        batch["advantages"] = torch.zeros_like(output["advantages"])
    try:
        return _final_norm_grads(built, batch)
    finally:
        trainer.kl_later_turns_only, trainer.beta = saved


def _regions(built, output):
    """Per two-turn row: its index and the bool masks of first-turn, feedback and later program tokens."""
    for row, (_, env) in enumerate(_episode_layout(output, built.trainer)):
        env = torch.tensor(env)
        if bool((env == 0).any()):
            first = torch.cumsum(1 - env, 0) == 0
            yield row, first, env == 0, (env == 1) & ~first


def test_the_kl_reaches_later_turns_only(later):
    built, output, episodes = later
    assert built.trainer.kl_later_turns_only and any(len(e.turns) == 2 for e in episodes)
    kl_only = _grads(built, output, later_only=True, advantages=False)
    everywhere = _grads(built, output, later_only=False, advantages=False)
    rows = 0
    for row, first, feedback, second in _regions(built, output):
        g = kl_only[row, : len(first)]
        assert torch.all(g[first] == 0), "a first-turn token got the KL's gradient"
        assert torch.all(g[feedback] == 0)
        assert g[second].abs().sum() > 0, "a later program got no KL gradient"
        # trl's own KL on every token: the first turn does get it (what `later` removes)
        assert everywhere[row, : len(first)][first].abs().sum() > 0
        rows += 1
    assert rows


def test_first_turns_get_the_policy_gradient_alone(later):
    built, output, _ = later
    assert output["advantages"].abs().sum() > 0
    with_later_kl = _grads(built, output, later_only=True)
    without_kl = _grads(built, output, later_only=False, beta=0.0)
    checked = 0
    for row, first, _, second in _regions(built, output):
        if output["advantages"][row] == 0:
            continue
        got, plain = with_later_kl[row, : len(first)], without_kl[row, : len(first)]
        assert torch.allclose(got[first], plain[first], rtol=1e-5, atol=1e-9)
        assert not torch.allclose(got[second], plain[second], rtol=1e-5, atol=1e-9)
        checked += 1
    assert checked


def test_the_batch_keeps_its_reference_log_probabilities(later):
    built, output, _ = later
    before = output[REF].clone()
    _grads(built, output, later_only=True)
    assert torch.equal(output[REF], before)  # trl reuses the batch over num_iterations


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"repair_kl_turns": "first"}, "'first' is not one of all, later"),
        ({"repair_kl_turns": "later"}, "needs a KL term: set beta > 0"),
        ({"repair_kl_turns": "later", "beta": 0.1, "algorithm": "rloo"}, "later is for grpo"),
        ({"repair_kl_turns": "later", "beta": 0.1, "repair_max_turns": 1}, "needs repair episodes"),
    ],
)
def test_bad_kl_turns_are_refused_naming_the_key(tmp_path, assets, values, message):
    from vprl.train.recipe.checks import validate
    from vprl.train.recipe.rl_config import parse_rl_config

    cfg = parse_rl_config(["--config", str(_recipe(tmp_path, assets, **values))])
    with pytest.raises(ConfigError, match=f"repair_kl_turns: .*{message}"):
        validate(cfg)
