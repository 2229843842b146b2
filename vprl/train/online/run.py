"""GRPO / RLOO through trl: the policy, the prompts as a dataset, the composed reward as
`reward_funcs`, the run-folder callbacks, train (resuming from a checkpoint), save the adapter.

With `overlap_execution` (the default) each batch's programs start executing right after
generation, while trl computes the old and reference log-probabilities, instead of when trl calls
the reward functions (`vprl.train.online.trainers`, `TrlRewardAdapter.prefetch`)."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from pathlib import Path
from typing import Any

from vprl.executor.runner import SyncRunner
from vprl.rewards.compose import RewardComposer
from vprl.rewards.trl_adapter import TrlRewardAdapter
from vprl.train.bootstrap.repair_pairs import load_repair_pairs
from vprl.train.online.callbacks import MetricsRecorder, ProgramTable, RolloutRecorder
from vprl.train.online.trainers import TRAINERS, stop_at_turn_end
from vprl.train.online.vllm_cpu import adapt_colocated_engine, cpu_engine_arguments
from vprl.train.policy.loading import load_model, load_tokenizer, policy_name
from vprl.train.prompts import STOP_SEQUENCES, completion_to_program, turn_end_ids
from vprl.train.prompts.conversation import RepairFormat, final_program
from vprl.train.recipe.checks import replay_pairs_path
from vprl.train.recipe.data import PromptedExample, trl_dataset
from vprl.train.recipe.rl_config import RLConfig
from vprl.train.repair.log import EpisodeLog, episodes_path
from vprl.train.repair.trl_rollout import RepairRollout, repair_shaping
from vprl.train.repair.turns import EpisodeLoop
from vprl.train.rollouts.log import RolloutLog
from vprl.train.rollouts.scorer import ProgramScorer
from vprl.train.runs import folder as runs

logger = logging.getLogger(__name__)


def build_trainer(
    cfg: RLConfig,
    prompted: list[PromptedExample],
    composer: RewardComposer,
    runner: SyncRunner,
    run_dir: Path,
    device: Any = None,
) -> tuple[Any, RolloutRecorder]:
    tokenizer = load_tokenizer(cfg.policy)
    model, peft_config = load_model(cfg.policy, device=device)
    dataset = trl_dataset(prompted, tokenizer, cfg.policy.framing)
    recorder = RolloutRecorder(
        RolloutLog.in_run(run_dir),
        {p.example.id: p.prompt_hash for p in prompted},
        policy_name(cfg.policy),
        keep_traces=cfg.rewards.rollout_traces,
    )
    examples = {p.example.id: p.example for p in prompted}
    # A repair run scores each final program in the episode loop and again through the reward
    # functions: the second time is served from memory (a few steps' programs).
    scorer = ProgramScorer(runner, composer, remember=4096 if cfg.repair.enabled else 0)
    adapter = TrlRewardAdapter(
        scorer,
        examples,
        final_program if cfg.repair.enabled else completion_to_program,
        [spec.name for spec in composer.config.rewards],
        on_batch=recorder.on_batch,
    )
    args = cfg.training
    args.reward_weights = adapter.reward_weights
    reward_funcs, repair = adapter.reward_funcs, {}
    if cfg.repair.enabled:
        repair = repair_rollout(cfg, scorer, examples, tokenizer, run_dir)
        if cfg.repair.repair_turn_cost or cfg.repair.repair_repeat_cost:
            reward_funcs = [*reward_funcs, repair_shaping]
            args.reward_weights = [*adapter.reward_weights, 1.0]
    stops = STOP_SEQUENCES if cfg.rewards.stop_at_program_end else ()
    if args.use_vllm and stops:
        args.generation_kwargs = {**(args.generation_kwargs or {}), "stop": list(stops)}
    turn_end = turn_end_ids(tokenizer, cfg.policy.framing)
    stop_at_turn_end(model, args, turn_end)
    colocated = args.use_vllm and args.vllm_mode == "colocate"
    with cpu_engine_arguments(model) if colocated else contextlib.nullcontext():
        trainer = TRAINERS[cfg.algorithm](
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[
                recorder,
                MetricsRecorder(runs.MetricsLog(run_dir), recorder, examples),  # per-task rows
                ProgramTable(
                    recorder,
                    cfg.rewards.program_table_steps,
                    images={p.example.id: p.example.image for p in prompted},
                    earlier_turns=repair["rollout_func"].earlier_turns if repair else None,
                ),
            ],
            **(repair if cfg.algorithm == "grpo" else {}),
        )
    if repair and cfg.algorithm == "rloo":  # RLOO takes no rollout_func: its episodes mixin plays them
        trainer.repair_rollout = repair["rollout_func"]
    trainer.kl_later_turns_only = cfg.repair.repair_kl_turns == "later"  # checked: grpo only
    trainer.repair_guide_weight = cfg.repair.repair_guide_weight  # checked: grpo only
    if cfg.repair.repair_replay_weight:  # checked: grpo, the pairs file there
        trainer.repair_replay_weight = cfg.repair.repair_replay_weight
        trainer.repair_replay_rows = cfg.repair.repair_replay_rows
        trainer.set_replay_pairs(load_repair_pairs(replay_pairs_path(cfg)), args.seed)
    trainer.repair_turn_advantage = cfg.repair.repair_turn_advantage  # checked: grpo with branches
    trainer.repair_first_credit = cfg.repair.repair_first_credit  # checked: grpo
    trainer.repair_first_weight = cfg.repair.repair_first_weight  # checked: grpo
    trainer.repair_later_credit = cfg.repair.repair_later_credit  # checked: grpo
    if colocated:
        adapt_colocated_engine(trainer)
    trainer.setup_program_training(
        stops,
        cfg.rewards.filter_zero_variance,
        reward_adapter=adapter,
        overlap_execution=cfg.rewards.overlap_execution,
        stop_token_ids=turn_end,
    )
    return trainer, recorder


def repair_rollout(cfg: RLConfig, scorer: ProgramScorer, examples: dict, tokenizer: Any, run_dir: Path) -> dict:
    """trl's `rollout_func` for repair episodes (vprl.train.repair.trl_rollout; under RLOO,
    vprl.train.repair.rloo plays it)."""
    rank = int(os.environ.get("RANK", "0"))
    rollout = RepairRollout(
        EpisodeLoop(scorer, cfg.repair.config()),
        examples,
        RepairFormat(tokenizer, cfg.policy.framing),
        on_episodes=EpisodeLog(episodes_path(run_dir, rank)),
        branches=cfg.repair.repair_branches,
    )
    return {"rollout_func": rollout}


def train_online(
    cfg: RLConfig,
    prompted: list[PromptedExample],
    composer: RewardComposer,
    runner: SyncRunner,
    run_dir: Path,
    checkpoint: tuple[int, Path] | None,
    state: Any,
) -> Path:
    device = state.device if cfg.policy.load_in_4bit else None
    trainer, _ = build_trainer(cfg, prompted, composer, runner, run_dir, device)
    check_sharding(trainer)
    trainer.train(resume_from_checkpoint=str(checkpoint[1]) if checkpoint else None)
    out = run_dir / runs.ADAPTER_DIR
    if trainer.is_fsdp_enabled:
        # transformers' save_model writes nothing under FSDP unless the state dict is gathered whole
        # (trl's default is sharded): the adapter would silently be missing.
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    trainer.save_model(str(out))  # the peft adapter (safetensors) and the tokenizer, main process only
    return out


def check_sharding(trainer: Any) -> None:
    """Warn when `accelerate launch` was asked for FSDP or DeepSpeed and the run is plain data
    parallel instead: accelerate does that without a word on CPU (docs/distributed.md), and on a
    GPU the unsharded model may then not fit."""
    asked = [
        name
        for name, var, enabled in (
            ("FSDP", "ACCELERATE_USE_FSDP", trainer.is_fsdp_enabled),
            ("DeepSpeed", "ACCELERATE_USE_DEEPSPEED", trainer.is_deepspeed_enabled),
        )
        if os.environ.get(var, "false").lower() == "true" and not enabled
    ]
    for name in asked:
        message = (
            f"accelerate was launched with {name}, but the trainer is not using it (accelerate runs CPU jobs as "
            "plain data parallel): every process holds the whole model"
        )
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        logger.warning(message)
