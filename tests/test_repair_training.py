"""The training signal of repair episodes (#35): GRPO over whole episodes through trl's
`rollout_func`, checked on what the trainer receives and on the loss's gradient.

- The feedback blocks are masked out of the loss (`env_mask`): the loss's gradient with respect to
  the hidden state that predicts a feedback token (the only input of that token's logits) is zero,
  and it is not zero where a program token of either turn is predicted.
- Every program token of an episode carries the episode's advantage: the group-relative reward of
  its final program (trl's advantage is one number per sequence; the mask covers both turns).
- The repair shaping (turn cost, repeat cost) reaches the advantage through trl's reward functions:
  with a sampler that writes some rows' first program again, each episode's advantage is the
  group-relative reward of its final program less its costs.
- The importance ratio of every program token is 1 with a sampler that draws from the policy: the
  trainer's log-probabilities over the assembled episode equal the sampler's, turn by turn, under
  transformers generation and under a vLLM stand-in that samples from the policy.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from rl_tiny import offline_wandb, write_recipe

from vprl.train.prompts.conversation import HEADER, conversation_text

TURNS = 2


@pytest.fixture(scope="module")
def assets(repair_assets):
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


@pytest.fixture(scope="module")
def hf_batch(tmp_path_factory, assets):
    yield from scored_batch(tmp_path_factory.mktemp("hf"), assets)


def test_every_episode_holds_its_turns_with_the_feedback_masked(hf_batch):
    built, output, episodes, _ = hf_batch
    tok = built.trainer.processing_class
    assert len(episodes) == 16 and all(len(e.turns) == TURNS for e in episodes)
    prompts = {row["example_id"]: row["prompt"] for row in built.trainer.train_dataset}
    for (ids, env), episode in zip(_episode_layout(output, built.trainer), episodes, strict=True):
        assert 0 in env and env[0] == 1, "the first program's tokens are trained, the feedback is not"
        feedback = tok.decode([t for t, m in zip(ids, env) if m == 0])
        assert feedback.lstrip().startswith(HEADER) and "def execute_command" in feedback
        assert episode.first.feedback is not None and episode.first.feedback.text.splitlines()[0] in feedback
        trained = tok.decode([t for t, m in zip(ids, env) if m == 1], skip_special_tokens=True)
        assert HEADER not in trained
        # the mask is one run of feedback between two runs of program
        runs = [m for i, m in enumerate(env) if i == 0 or env[i - 1] != m]
        assert runs == [1, 0, 1]
        # the text up to the second program reads as the conversation the evaluation and the
        # bootstrap write from programs: the body, one newline, the block, the query and signature
        second = env.index(0) + env[env.index(0) :].index(1)
        first_body = tok.decode(ids[: env.index(0)], skip_special_tokens=True)
        prompt = prompts[episode.example_id]
        assert prompt + tok.decode(ids[:second], skip_special_tokens=True) == conversation_text(
            prompt, [first_body], [episode.first.feedback]
        )


def test_the_advantage_of_every_turn_is_the_episode_advantage(hf_batch):
    built, output, episodes, totals = hf_batch
    group = built.trainer.num_generations
    # trl's reward functions scored each episode's final program, and nothing else
    assert set(totals) == {e.final.program for e in episodes}
    finals = torch.tensor([totals[e.final.program] for e in episodes], dtype=torch.float32)
    grouped = finals.view(-1, group)
    expected = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
    assert output["advantages"].shape == (len(episodes),)  # one number per episode, all its tokens
    assert torch.allclose(output["advantages"], expected.flatten(), atol=1e-5)
    loss_mask = output["completion_mask"] * output["tool_mask"]
    for row, (_, env) in enumerate(_episode_layout(output, built.trainer)):
        first_end = env.index(0)
        second = [i for i, m in enumerate(env) if m == 1 and i > first_end]
        assert loss_mask[row, :first_end].all() and second and loss_mask[row, second].all()


def _repeating_later_turns(trainer):
    """The trainer's `_generate_single_turn` with every other later-turn context answered by its row's
    first program again (the ids sampled for it), the others sampled as they were."""
    original, firsts = trainer._generate_single_turn, []

    def generate(prompt_ids, images, multimodal_fields, num_generations, *args, **kwargs):
        ids, logprobs = original(prompt_ids, images, multimodal_fields, num_generations, *args, **kwargs)
        if not firsts:  # the first turn: one row per episode
            firsts.extend((list(p), list(c)) for p, c in zip(prompt_ids, ids, strict=True))
            return ids, logprobs
        ids = [list(c) for c in ids]  # transformers generation keeps no sampling log-probabilities
        for k, context in enumerate(prompt_ids):
            if k % 2:
                continue
            (first,) = {tuple(c) for p, c in firsts if list(context[: len(p) + len(c) - 1]) == p + c[:-1]}
            ids[k] = list(first)
        return ids, logprobs

    return generate


def test_the_repeat_and_turn_costs_reach_the_advantage(tmp_path, assets):
    from vprl.train.repair.turns import episode_shaping, repeats

    built = _Built(_recipe(tmp_path, assets, repair_turn_cost=0.1, repair_repeat_cost=0.5))
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(built.trainer, "_generate_single_turn", _repeating_later_turns(built.trainer))
            output, totals = spread_batch(built)
        episodes, config = built.trainer.rollout_func.last_episodes, built.cfg.repair.config()
    finally:
        built.close()
    counts = [repeats(e) for e in episodes]
    assert all(len(e.turns) == TURNS for e in episodes) and 0 < sum(counts) < len(episodes)
    rewards = torch.tensor([totals[e.final.program] + episode_shaping(e, config) for e in episodes])
    assert {round(episode_shaping(e, config), 6) for e in episodes} == {-0.1, -0.6}
    grouped = rewards.view(-1, built.trainer.num_generations)
    expected = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
    assert torch.allclose(output["advantages"], expected.flatten(), atol=1e-5)


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


def test_feedback_tokens_get_no_gradient(hf_batch):
    built, output, _, _ = hf_batch
    assert_no_feedback_gradient(built, output, _episode_layout(output, built.trainer))


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
        start = 0
        while start < len(ids):  # each run of program tokens, scored after everything before it
            if env[start] == 0:
                start += 1
                continue
            end = start
            while end < len(ids) and env[end] == 1:
                end += 1
            drawn = _sampler_logps(trainer.model, prompt_ids[row] + ids[:start], ids[start:end], trainer.temperature)
            got = trainer_logps[row, start:end].tolist()
            ratios = [math.exp(a - b) for a, b in zip(got, drawn, strict=True)]
            assert ratios == pytest.approx([1.0] * len(ratios), abs=2e-4), (row, start)
            checked += end - start
            start = end
    return checked


def test_importance_ratios_are_one_under_transformers_generation(hf_batch):
    built, output, _, _ = hf_batch
    assert _assert_ratios_one(built, output) > 0


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


def test_importance_ratios_are_one_with_a_vllm_sampler_that_draws_from_the_policy(tmp_path, assets, monkeypatch):
    built = built_on_fake_vllm(tmp_path, assets, monkeypatch)
    try:
        output = built.batch()
        assert all(len(e.turns) == TURNS for e in built.trainer.rollout_func.last_episodes)
        assert_vllm_ratios_one(built, output)
    finally:
        built.close()


def test_rl_py_trains_on_episodes_and_logs_them(tmp_path, assets, monkeypatch):
    """The entry point end to end: two GRPO steps over repair episodes; the rollouts score each
    episode's final program, `episodes.jsonl` holds every episode with its turns, and the metrics
    carry the repair figures and the turn cost."""
    import json

    from vprl.train.repair.log import EpisodeLog, episodes_path
    from vprl.train.rl import main
    from vprl.train.rollouts.log import RolloutLog

    recipe = _recipe(
        tmp_path, assets, repair_stop_when="ran", repair_check=None, repair_pass_threshold=1.0, repair_turn_cost=0.1
    )
    with offline_wandb(monkeypatch):
        main(
            ["--config", str(recipe), "--max_steps", "2", "--save_steps", "2"]
            + ["--report_to", "wandb", "--program_table_steps", "1"]
        )
    run = tmp_path / "run"
    episodes = list(EpisodeLog(episodes_path(run)).read())
    assert [step for step, _ in episodes] == [1] * 16 + [2] * 16  # the optimizer step they train, as rollouts
    for _, episode in episodes:
        assert 1 <= len(episode.turns) <= TURNS
        # the stop rule: only a program that did not run gets a second turn
        assert all(t.status != "ok" for t in episode.turns[:-1])
        assert all(t.feedback is not None for t in episode.turns[:-1]) and episode.final.feedback is None
    rows = RolloutLog.in_run(run).read()
    assert sorted(r.program for r in rows) == sorted(e.final.program for _, e in episodes)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged = [m for m in metrics if "repair/turns_mean" in m]
    assert len(logged) == 2 and all(1.0 <= m["repair/turns_mean"] <= TURNS for m in logged)
    assert any("rewards/repair_shaping/mean" in m for m in metrics)
    # wandb's programs table: a repaired program's row shows the turns before it with their feedback
    (offline,) = run.glob("wandb/offline-run-*")
    tables = sorted(offline.glob("files/media/table/programs/step_*.table.json"))
    table = json.loads(tables[-1].read_text())
    column = table["columns"].index("earlier turns")
    program = table["columns"].index("program")
    by_final = {(e.example_id, e.final.program): e for step, e in episodes if step == 2}
    example = table["columns"].index("example_id")
    for row in table["data"]:
        episode = by_final[row[example], row[program]]
        if len(episode.turns) > 1:
            assert episode.first.program in row[column] and episode.first.feedback.text in row[column]
        else:
            assert row[column] == ""


def test_rest_samples_episodes_and_keeps_their_final_programs(tmp_path, assets):
    """ReST over episodes end to end: one iteration of 4 questions x 2 episodes; every rollout row is
    an episode's final program, and a kept program of a repaired episode carries its conversation."""
    import json

    import yaml

    from vprl.train.rest.iterations import iteration_dir
    from vprl.train.rl import main
    from vprl.train.rollouts.log import RolloutLog

    recipe = yaml.safe_load(_recipe(tmp_path, assets).read_text())
    for key in ("num_generations", "max_completion_length", "per_device_train_batch_size", "temperature"):
        recipe.pop(key)
    recipe.update(
        algorithm="rest",
        rest_iterations=1,
        num_generations=2,
        max_completion_length=64,
        dataset_limit=4,
        per_device_train_batch_size=2,
        repair_stop_when="ran",
        repair_check=None,
        repair_pass_threshold=1.0,
        rest_keep_threshold=-2.0,  # keep everything that was judged: the contexts are what is checked
    )
    path = tmp_path / "rest.yaml"
    path.write_text(yaml.safe_dump(recipe))
    main(["--config", str(path)])
    run = tmp_path / "run"
    rows = RolloutLog.in_run(run).read()
    assert len(rows) == 8 and all(r.step == 0 for r in rows)
    kept = [json.loads(line) for line in (iteration_dir(run, 0) / "kept.jsonl").read_text().splitlines()]
    assert kept
    for k in kept:
        if k["context"] is not None:
            assert HEADER in k["context"] and k["context"].rstrip().endswith(":")
    repaired = [k for k in kept if k["context"] is not None]
    failed_first = [r for r in rows if r.status != "ok"]
    # a program that failed was written again, so some kept final programs come after feedback
    assert repaired or not failed_first
