"""The training signal of repair episodes under RLOO (#35), which trl 1.16 trains without a
`rollout_func` (`vprl/train/repair/rloo.py`), checked on what the trainer receives:

- every episode is one sequence attended as a whole (RLOO's completion mask is its attention mask)
  and its feedback tokens are 0 in `env_mask`;
- RLOO's leave-one-out advantage of each episode comes from its final program's reward;
- the loss's gradient at the hidden state predicting a feedback token is exactly zero;
- RLOO's sequence log-probability (the old one it forms the ratio with, and the loss's) is the sum
  over the program tokens of each turn's own log-probabilities, scored in that turn's own context,
  under transformers generation and a vLLM stand-in that samples from the policy; the ratio is 1.
"""

from __future__ import annotations

import json

import pytest
import torch
from repair_trainer import (
    TURNS,
    _Built,
    _recipe,
    _sampler_logps,
    assert_no_feedback_gradient,
    assets,
    program_runs,
    scored_batch,
)

from vprl.train.prompts.conversation import HEADER

__all__ = ["assets"]  # the module fixture


def _layout(output: dict) -> list[tuple[list[int], list[int]]]:
    """Per row: the episode's ids and its env mask, without padding."""
    out = []
    for ids, mask, env in zip(output["completion_ids"], output["completion_mask"], output["env_mask"], strict=True):
        n = int(mask.sum())
        out.append((ids[:n].tolist(), env[:n].tolist()))
    return out


@pytest.fixture(scope="module")
def rloo_batch(tmp_path_factory, assets):
    yield from scored_batch(tmp_path_factory.mktemp("rloo"), assets, algorithm="rloo")


def test_rloo_episodes_are_attended_whole_with_the_feedback_out_of_env_mask(rloo_batch):
    built, output, episodes, _ = rloo_batch
    tok = built.trainer.processing_class
    assert len(episodes) == 16 and all(len(e.turns) == TURNS for e in episodes)
    assert output["env_mask"].shape == output["completion_ids"].shape
    for (ids, env), episode in zip(_layout(output), episodes, strict=True):
        runs = [m for i, m in enumerate(env) if i == 0 or env[i - 1] != m]
        assert runs == [1, 0, 1], "one run of feedback between two programs"
        feedback = tok.decode([t for t, m in zip(ids, env) if m == 0])
        assert feedback.lstrip().startswith(HEADER) and episode.first.feedback.text.splitlines()[0] in feedback
        trained = tok.decode([t for t, m in zip(ids, env) if m == 1], skip_special_tokens=True)
        assert HEADER not in trained
    # the reward functions got the turn columns (the turn cost reads them)
    assert all(len(e.turns) == TURNS for e in episodes)


def test_rloo_advantage_is_leave_one_out_over_final_programs(rloo_batch):
    built, output, episodes, totals = rloo_batch
    trainer = built.trainer
    assert set(totals) == {e.final.program for e in episodes}  # the rewards scored the final programs only
    rewards = torch.tensor([totals[e.final.program] for e in episodes], dtype=torch.float32)
    if trainer.beta:  # RLOO's KL sits in the reward; the adapter starts at the reference: no KL yet
        assert trainer.ref_model is None
    grouped = rewards.view(-1, trainer.num_generations)
    baseline = (grouped.sum(1, keepdim=True) - grouped) / (trainer.num_generations - 1)
    expected = (grouped - baseline).flatten()
    if trainer.normalize_advantages:
        expected = (expected - expected.mean()) / (expected.std() + 1e-4)
    assert torch.allclose(output["advantages"], expected, atol=1e-4)


def test_rloo_feedback_tokens_get_no_gradient(rloo_batch):
    built, output, _, _ = rloo_batch
    assert_no_feedback_gradient(built, output, _layout(output))


def _assert_sequence_logps_are_the_turns_own(built, output) -> None:
    """RLOO's old sequence log-probability, and the loss's, against each turn's tokens scored after
    everything before them in one unpadded forward (what a sampler drawing from the policy drew
    them with), summed over program tokens."""
    trainer = built.trainer
    prompts = [ids[m.bool()].tolist() for ids, m in zip(output["prompt_ids"], output["prompt_mask"], strict=True)]
    expected = []
    for row, (ids, env) in enumerate(_layout(output)):
        total = 0.0
        for start, end in program_runs(env):
            drawn = _sampler_logps(trainer.model, prompts[row] + ids[:start], ids[start:end], trainer.temperature)
            total += sum(drawn)
        expected.append(total)
    expected = torch.tensor(expected)
    assert torch.allclose(output["old_logps"], expected, atol=2e-3, rtol=0), (
        (output["old_logps"] - expected).abs().max()
    )
    # the loss's pass, with the mask the batch carries: the ratio exp(new - old) is 1
    ids_all = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    trainer._env_mask = output["env_mask"]
    try:
        with torch.no_grad():
            logps, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids_all, attention, output["completion_ids"].size(1)
            )
    finally:
        trainer._env_mask = None
    new = (logps * output["completion_mask"]).sum(1)
    assert torch.allclose((new - output["old_logps"]).exp(), torch.ones(len(new)), atol=1e-4)


def test_rloo_sequence_logps_are_the_turns_own_under_transformers_generation(rloo_batch):
    built, output, _, _ = rloo_batch
    _assert_sequence_logps_are_the_turns_own(built, output)


def test_rloo_sequence_logps_with_a_vllm_sampler_that_draws_from_the_policy(tmp_path, assets, monkeypatch):
    import trl.trainer.rloo_trainer as rloo_trainer
    from fake_vllm import PolicyVLLMGeneration

    import vprl.train.recipe.checks

    monkeypatch.setattr(rloo_trainer, "VLLMGeneration", PolicyVLLMGeneration)
    monkeypatch.setattr(vprl.train.recipe.checks, "require_vllm", lambda key: None)  # vLLM is not installed here
    built = _Built(_recipe(tmp_path, assets, algorithm="rloo", use_vllm=True, vllm_mode="colocate", top_p=1.0))
    try:
        output = built.batch(prompts=2)  # the stand-in samples token by token: a smaller batch
        episodes = built.trainer.repair_rollout.last_episodes
        assert all(len(e.turns) == TURNS for e in episodes)
        engine = PolicyVLLMGeneration.instances[-1]
        assert engine.calls == 2  # the first turns, then the second turns: one call each
        # each second turn was drawn from exactly the context the trainer holds before it
        prompts = [i[m.bool()].tolist() for i, m in zip(output["prompt_ids"], output["prompt_mask"], strict=True)]
        assert len(engine.prompts) == 2 * len(episodes)
        for row, (ids, env) in enumerate(_layout(output)):
            second = env.index(0) + env[env.index(0) :].index(1)
            assert engine.prompts[len(episodes) + row] == prompts[row] + ids[:second]
        _assert_sequence_logps_are_the_turns_own(built, output)
    finally:
        built.close()


def test_rl_py_trains_rloo_on_episodes(tmp_path, assets):
    """The entry point end to end: an RLOO step over episodes logs the repair figures and the turn
    cost, and every episode lands in `episodes.jsonl`."""
    from vprl.train.repair.log import EpisodeLog, episodes_path
    from vprl.train.rl import main

    recipe = _recipe(
        tmp_path,
        assets,
        algorithm="rloo",
        repair_stop_when="ran",
        repair_check=None,
        repair_pass_threshold=1.0,
        repair_turn_cost=0.1,
    )
    main(["--config", str(recipe), "--max_steps", "1", "--save_steps", "1", "--report_to", "none"])
    run = tmp_path / "run"
    episodes = list(EpisodeLog(episodes_path(run)).read())
    assert len(episodes) == 16 and all(1 <= len(e.turns) <= TURNS for _, e in episodes)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("repair/turns_mean" in m for m in metrics)
    assert any("rewards/repair_shaping/mean" in m for m in metrics)
