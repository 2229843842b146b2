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

import pytest
import torch
from repair_trainer import (
    TURNS,
    _assert_ratios_one,
    _Built,
    _episode_layout,
    _recipe,
    assert_no_feedback_gradient,
    assert_vllm_ratios_one,
    assets,
    built_on_fake_vllm,
    scored_batch,
    spread_batch,
)
from rl_tiny import offline_wandb

from vprl.train.prompts.conversation import HEADER, conversation_text

__all__ = ["assets"]  # the module fixture


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


def test_feedback_tokens_get_no_gradient(hf_batch):
    built, output, _, _ = hf_batch
    assert_no_feedback_gradient(built, output, _episode_layout(output, built.trainer))


def test_importance_ratios_are_one_under_transformers_generation(hf_batch):
    built, output, _, _ = hf_batch
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
