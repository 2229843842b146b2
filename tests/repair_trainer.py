"""The repair trainer the training-signal tests share (GRPO and RLOO over episodes, branched or
not): a recipe over the tiny world and policy, the trainer `vprl/train/rl.py` builds for it, one
scored batch with the final programs' totals spread, and the checks of the signal itself (no
gradient at feedback tokens, importance ratios of 1 against a sampler drawing from the policy)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from rl_tiny import write_recipe

TURNS = 2


@pytest.fixture(scope="module")
def assets(repair_assets):
    """The tiny world and repair policy (conftest's session fixture), imported by each test module."""
    return repair_assets


def _recipe(tmp_path: Path, assets, **values) -> Path:
    world, policy = assets
    base = dict(
        model_name_or_path=str(policy),
        dataset_root=str(world),
        tool_stack="shapes",
        output_dir=str(tmp_path / "run"),
        warmup_steps=0,
        per_device_train_batch_size=16,  # 4 prompts x 4 samples
        max_completion_length=40,
        repair_max_turns=TURNS,
        repair_stop_when="passed",
        repair_check="correctness",
        # Above any correctness: every first program gets feedback, so every episode has two turns.
        repair_pass_threshold=2.0,
        temperature=1.0,
    )
    return write_recipe(tmp_path / "recipe.yaml", **{**base, **values})


class _Built:
    """The trainer `vprl/train/rl.py` builds for a recipe, with the executor open."""

    def __init__(self, recipe: Path):
        from vprl.rewards.compose import RewardComposer
        from vprl.train import rl
        from vprl.train.online.run import build_trainer
        from vprl.train.recipe.checks import validate
        from vprl.train.recipe.data import build_prompts
        from vprl.train.recipe.rl_config import parse_rl_config

        self.cfg = parse_rl_config(["--config", str(recipe)])
        checked = validate(self.cfg)
        self.prompted = build_prompts(checked.examples, checked.prompts)
        run_dir = Path(self.cfg.training.output_dir)
        self._executor = rl.executor(checked)
        runner, host, _ = self._executor.__enter__()
        composer = RewardComposer(checked.rewards, resources={"runner": runner, "tool_host": host})
        self.trainer, _ = build_trainer(self.cfg, self.prompted, composer, runner, run_dir)

    def close(self):
        self._executor.__exit__(None, None, None)

    def batch(self, prompts: int = 4) -> dict:
        """One generation batch as trl's sampler gives it (each row num_generations times), scored."""
        trainer = self.trainer
        rows = [trainer.train_dataset[i] for i in range(prompts) for _ in range(trainer.num_generations)]
        trainer.model.train()
        return trainer._generate_and_score_completions(rows)


def _episode_layout(output: dict, trainer) -> list[tuple[list[int], list[int]]]:
    """Per row: the completion's ids and its env mask, without padding."""
    out = []
    for ids, mask, env in zip(output["completion_ids"], output["completion_mask"], output["tool_mask"], strict=True):
        n = int(mask.sum())
        out.append((ids[:n].tolist(), env[:n].tolist()))
    return out


def _spread_totals(scored_totals: dict[str, float]):
    """`ProgramScorer.ascore` (the path of trl's reward functions, not the episode loop's) with each
    program's total replaced by a number drawn from its text, recorded in `scored_totals`: a tiny
    policy's final programs may all score the same, and a group of equal rewards has no advantage to
    check. The trainer still receives it through trl's reward functions and advantage computation."""
    import zlib

    from vprl.train.rollouts.scorer import ProgramScorer

    original = ProgramScorer.ascore

    async def ascore(self, examples, programs):
        scored = await original(self, examples, programs)
        totals = [zlib.crc32(p.encode()) % 97 / 97 for p in programs]
        scored_totals.update(zip(programs, totals, strict=True))
        scored.rewards.totals[:] = totals
        return scored

    return ascore


def spread_batch(built: _Built) -> tuple[dict, dict[str, float]]:
    """One scored generation batch with the final programs' totals spread (`_spread_totals`)."""
    from vprl.train.rollouts.scorer import ProgramScorer

    totals: dict[str, float] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ProgramScorer, "ascore", _spread_totals(totals))
        torch.manual_seed(0)
        return built.batch(), totals


def scored_batch(folder: Path, assets, **values):
    """Yields (built trainer, one `spread_batch`, its episodes, the spread totals) for the recipe with
    `values`, and closes the executor after: the body of the modules' batch fixtures."""
    built = _Built(_recipe(folder, assets, **values))
    try:
        output, totals = spread_batch(built)
        rollout = getattr(built.trainer, "repair_rollout", None) or built.trainer.rollout_func  # RLOO's or GRPO's
        yield built, output, rollout.last_episodes, totals
    finally:
        built.close()


def _final_norm_grads(built, output) -> torch.Tensor:
    """The loss's gradient with respect to the final hidden states (what the fused LM head turns into
    each position's logits), over the completion positions."""
    trainer = built.trainer
    captured = {}
    norm = trainer.model.get_base_model().model.norm

    def keep(module, args, out):
        out.retain_grad()
        captured["h"] = out

    handle = norm.register_forward_hook(keep)
    try:
        trainer.model.zero_grad()
        trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # set by trl's loop
        loss = trainer.compute_loss(trainer.model, output)
        loss.backward()
    finally:
        handle.remove()
    grad = captured["h"].grad  # (batch, prompt + completion, hidden)
    width = output["completion_ids"].size(1)
    # position p predicts token p + 1: the completion's token j is predicted at prompt_len + j - 1
    return grad[:, -width - 1 : -1].norm(dim=-1)


def assert_no_feedback_gradient(built, output, layout: list[tuple[list[int], list[int]]]) -> None:
    """The gradient at every hidden state predicting a feedback token is zero; not at both turns'
    program tokens (rows with an advantage)."""
    assert output["advantages"].abs().sum() > 0, "no advantage in the batch: nothing to check"
    grads = _final_norm_grads(built, output)
    checked = 0
    for row, (_, env) in enumerate(layout):
        if output["advantages"][row] == 0:
            continue
        env = torch.tensor(env)
        g = grads[row, : len(env)]
        assert torch.all(g[env == 0] == 0), "a feedback token's logits got a gradient"
        first_end = int((env == 0).nonzero()[0])
        assert g[:first_end].abs().sum() > 0 and g[env == 1][first_end:].abs().sum() > 0
        checked += 1
    assert checked


def _sampler_logps(model, context: list[int], tokens: list[int], temperature: float) -> list[float]:
    """The policy's log-probabilities of `tokens` after `context`, one unpadded forward: what a
    sampler drawing from the policy drew them with."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([context + tokens])).logits[0, len(context) - 1 : -1]
    logp = (logits.float() / temperature).log_softmax(-1)
    return logp.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1).tolist()


def _assert_ratios_one(built, output) -> int:
    trainer = built.trainer
    prompt_ids = [ids[m.bool()].tolist() for ids, m in zip(output["prompt_ids"], output["prompt_mask"], strict=True)]
    ids_all = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    with torch.no_grad():
        trainer_logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids_all, attention, output["completion_ids"].size(1)
        )
    checked = 0
    for row, (ids, env) in enumerate(_episode_layout(output, trainer)):
        for start, end in program_runs(env):  # each run of program tokens, scored after everything before it
            drawn = _sampler_logps(trainer.model, prompt_ids[row] + ids[:start], ids[start:end], trainer.temperature)
            got = trainer_logps[row, start:end].tolist()
            ratios = [math.exp(a - b) for a, b in zip(got, drawn, strict=True)]
            assert ratios == pytest.approx([1.0] * len(ratios), abs=2e-4), (row, start)
            checked += end - start
    return checked


def program_runs(env: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of program tokens (1) in an episode's environment mask."""
    runs, start = [], 0
    while start < len(env):
        if env[start] == 0:
            start += 1
            continue
        end = start
        while end < len(env) and env[end] == 1:
            end += 1
        runs.append((start, end))
        start = end
    return runs


def built_on_fake_vllm(tmp_path, assets, monkeypatch, **values) -> _Built:
    """The trainer of the recipe with `values` on colocated vLLM, played by a stand-in that samples
    from the policy (`fake_vllm.PolicyVLLMGeneration`, its instances cleared)."""
    import trl.trainer.grpo_trainer as grpo_trainer
    from fake_vllm import PolicyVLLMGeneration

    import vprl.train.recipe.checks

    monkeypatch.setattr(grpo_trainer, "VLLMGeneration", PolicyVLLMGeneration)
    monkeypatch.setattr(vprl.train.recipe.checks, "require_vllm", lambda key: None)  # vLLM is not installed here
    PolicyVLLMGeneration.instances.clear()
    return _Built(_recipe(tmp_path, assets, use_vllm=True, vllm_mode="colocate", top_p=1.0, **values))


def assert_vllm_ratios_one(built, output) -> None:
    """trl's importance-sampling weights (sampler vs trainer, over program tokens only) are 1, and so is
    every program token's ratio against the sampler's log-probability in its own turn's context."""
    mask = (output["completion_mask"] * output["tool_mask"]).bool()
    weights = output["importance_sampling_ratio"]
    assert torch.allclose(weights.expand_as(mask)[mask], torch.ones(()), atol=2e-4)
    assert _assert_ratios_one(built, output) > 0
