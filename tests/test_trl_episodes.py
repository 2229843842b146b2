"""Repair episodes from a user's own trl script (#35, the for_trl entry): trl's GRPOTrainer with
vprl's `repair_rollout`, as `vprl/train/integrations/trl_episodes.py` documents it; what the trainer
receives: two turns per episode, the feedback out of the loss mask, rewards of final programs."""

from __future__ import annotations

import pytest
import torch

from vprl.train.integrations.for_trl import load_examples, program_rewards, trl_dataset
from vprl.train.integrations.trl_episodes import repair_rollout, with_episode_rows
from vprl.train.prompts.conversation import HEADER


def test_a_plain_grpo_trainer_trains_on_episodes(repair_assets, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    world, policy = repair_assets
    tokenizer = AutoTokenizer.from_pretrained(str(policy))
    dataset = trl_dataset(load_examples("shapes", str(world), tasks=["train"])[:8], layout="bare")
    with program_rewards(["correctness"], tool_stack="shapes", episodes=True) as rewards:
        # a threshold no correctness reaches: every first program gets feedback
        rollout = repair_rollout(rewards, tokenizer, stop_when="passed", check="correctness", pass_threshold=2.0)
        config = GRPOConfig(
            output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=8, num_generations=4,
            max_completion_length=40, logging_steps=1, report_to="none", use_cpu=True,
            reward_weights=rewards.weights, temperature=1.0,
        )  # fmt: skip
        trainer = with_episode_rows(GRPOTrainer)(
            model=AutoModelForCausalLM.from_pretrained(str(policy)),
            processing_class=tokenizer,
            reward_funcs=rewards.funcs,
            rollout_func=rollout,
            args=config,
            train_dataset=dataset,
        )
        rows = [trainer.train_dataset[i] for i in range(2) for _ in range(4)]
        trainer.model.train()
        torch.manual_seed(0)
        output = trainer._generate_and_score_completions(rows)
        episodes = rollout.last_episodes
        assert len(episodes) == 8 and all(len(e.turns) == 2 for e in episodes)
        for ids, mask, env, episode in zip(
            output["completion_ids"], output["completion_mask"], output["tool_mask"], episodes, strict=True
        ):
            n = int(mask.sum())
            env = env[:n].tolist()
            assert [m for i, m in enumerate(env) if i == 0 or env[i - 1] != m] == [1, 0, 1]
            feedback = tokenizer.decode([t for t, m in zip(ids[:n].tolist(), env) if m == 0])
            assert feedback.lstrip().startswith(HEADER) and episode.first.feedback.text.splitlines()[0] in feedback
        # the rewards scored each episode's final program: trl's correctness column is the episodes'
        correctness = trainer._metrics["train"]["rewards/correctness/mean"][-1]
        finals = [(e.final.components.get("correctness") or 0.0) if e.final.status == "ok" else 0.0 for e in episodes]
        assert correctness == pytest.approx(sum(finals) / len(finals))
        assert trainer._metrics["train"]["repair/turns_mean"][-1] == 2.0
        result = trainer.train()
    assert result.global_step == 1


def test_the_rollout_refuses_rewards_that_would_score_the_first_program(repair_assets):
    from transformers import AutoTokenizer

    _, policy = repair_assets
    tokenizer = AutoTokenizer.from_pretrained(str(policy))
    with (
        program_rewards(["correctness"], tool_stack="shapes") as rewards,
        pytest.raises(ValueError, match="episodes="),
    ):
        repair_rollout(rewards, tokenizer)
    match = "check 'unit_tests' is not one of the rewards"
    with program_rewards(["correctness"], episodes=True) as rewards, pytest.raises(ValueError, match=match):
        repair_rollout(rewards, tokenizer, check="unit_tests")
