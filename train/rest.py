"""The ReST loop (ViUniT / ViReP's "RL"): sample N programs per question, score them through the
executor, keep the rewarded ones, fine-tune the LoRA on them with trl's SFTTrainer, repeat K times,
one adapter per iteration.

What ViUniT's code (`train.py` + `train_virep.py`) does, and what we keep or change:

- keep: `reward > 0` (their `improve_dataset.filter(lambda x: x['reward'] > 0.)`); here
  `keep_threshold` / `keep_rule` on the composed total, 0 and "above" by default. Their reward
  weighting of the loss never runs (the `...WithReward` classes are dropped by `from_pretrained`),
  so training is filter-only: so is ours.
- continue, not restart: iteration k loads `model_{k-1}` (`PeftModel.from_pretrained(...,
  is_trainable=True)`) and trains on iteration k's kept programs. `restart_from_base=True` instead
  trains every iteration from the policy's initial adapter (ReST-EM's choice), still sampling with
  the latest one. Their trainer also resumes optimizer and scheduler state with
  `num_train_epochs = epochs * (k + 1)`, which HF's resume turns into a step count measured on the
  *previous* dataset's size; we start a fresh optimizer and warmup+linear schedule each iteration.
- same prompt for sampling and training: they sample with the long API prompt and train on a short
  one with no API listing (and may put two BOS in front for vLLM). Here the training sequence is
  `encode_prompt(frame_prompt(prompt))`, the exact ids the generator fed the model, followed by the
  program body the model wrote and EOS; the loss covers the body and EOS only.
- dedupe: identical programs (by `program_key`) of one question are kept once;
  `max_kept_per_query` caps the rest (best reward first).

Files: `run_dir/iterations/initial/adapter` (the policy's adapter before iteration 0),
`run_dir/iterations/iter-{k}/{adapter/, summary.json, kept.jsonl}`. The adapter folder appears last
(renamed into place), so its presence marks the iteration done: resume skips it, reloads the last
done adapter and truncates the rollouts log after that iteration.

Several processes (`accelerate launch --num_processes N`): the main process alone samples, scores,
writes the rollouts log and saves adapters and summaries; the SFT examples it built are broadcast,
and every process runs the SFT step (trl's trainer wraps the model in DDP, so gradients are
averaged and every copy of the adapter stays the same).

Sampling, scoring and selecting one iteration's training set is `train.rest_select`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelerate.utils import broadcast_object_list
from tqdm.auto import tqdm

from data.records import Example
from train.generation import Generator, SamplingConfig
from train.prompts.framing import STYLES
from train.rest_select import KeptProgram, sample_iteration, select_kept, zero_variance_groups
from train.rest_sft import (
    ADAPTER_WEIGHTS,
    LOOP_OWNED,
    check_sft_overrides,
    load_adapter,
    program_body,
    save_adapter,
    sft_example,
    sft_state,
    train_sft,
)
from train.rollouts import RolloutLog
from train.scoring import ProgramScorer

__all__ = [
    "IterationSummary",
    "KeptProgram",
    "RestConfig",
    "adapter_dir",
    "initial_adapter_dir",
    "is_done",
    "iteration_dir",
    "program_body",
    "read_summary",
    "run_rest",
    "select_kept",
    "sft_example",
    "zero_variance_groups",
]

logger = logging.getLogger(__name__)

KEEP_RULES = ("above", "at_least")
ITERATIONS_DIR = "iterations"


@dataclass(frozen=True)
class RestConfig:
    """The loop and its SFT step. Defaults: ViUniT's training recipe (lr 2e-4, linear schedule,
    warmup 0.1, max grad norm 0.3, per-device batch 2, one epoch per iteration, keep reward > 0).

    keep_rule: "above" keeps total > keep_threshold; "at_least" keeps total >= keep_threshold.
    max_kept_per_query: at most this many distinct programs per question (None: no cap).
    restart_from_base: train each iteration from the initial adapter instead of the previous one.
    style: prompt framing (train.prompts.frame_prompt), the same the generator uses.
    max_length: a longer prompt + program is left out of SFT (counted in the summary).
    sft_overrides: further `trl.SFTConfig` fields (e.g. report_to, optim, bf16).
    """

    iterations: int = 3
    samples_per_query: int = 8
    keep_threshold: float = 0.0
    keep_rule: str = "above"
    dedupe: bool = True
    max_kept_per_query: int | None = None
    restart_from_base: bool = False
    style: str = "auto"
    learning_rate: float = 2e-4
    lr_scheduler_type: str = "linear"
    warmup_ratio: float = 0.1
    max_grad_norm: float = 0.3
    epochs: float = 1.0
    batch_size: int = 2
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = False
    max_length: int = 4096
    seed: int = 42
    sft_overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        positive = ("iterations", "samples_per_query", "batch_size", "gradient_accumulation_steps", "max_length")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RestConfig.{name} must be a positive integer, got {value!r}")
        if self.keep_rule not in KEEP_RULES:
            raise ValueError(f"RestConfig.keep_rule: {self.keep_rule!r} is not one of {KEEP_RULES}")
        if self.max_kept_per_query is not None and (
            isinstance(self.max_kept_per_query, bool)
            or not isinstance(self.max_kept_per_query, int)
            or self.max_kept_per_query < 1
        ):
            raise ValueError(
                f"RestConfig.max_kept_per_query must be a positive integer or null, got {self.max_kept_per_query!r}"
            )
        if not math.isfinite(self.keep_threshold):
            raise ValueError(f"RestConfig.keep_threshold must be finite, got {self.keep_threshold!r}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"RestConfig.warmup_ratio must be in [0, 1), got {self.warmup_ratio!r}")
        if self.learning_rate <= 0 or self.max_grad_norm <= 0 or self.epochs <= 0:
            raise ValueError("RestConfig.learning_rate, max_grad_norm and epochs must be positive")
        if not isinstance(self.sft_overrides, dict):
            raise ValueError(f"RestConfig.sft_overrides must be a mapping, got {type(self.sft_overrides).__name__}")
        clash = sorted(set(LOOP_OWNED) & set(self.sft_overrides))
        if clash:
            raise ValueError(f"RestConfig.sft_overrides: {clash} are set by the ReST loop itself")
        if self.style not in STYLES:
            raise ValueError(f"RestConfig.style: {self.style!r} is not one of {STYLES}")

    def keeps(self, total: float | None) -> bool:
        if total is None:  # infra_error: masked, never a training target
            return False
        return total > self.keep_threshold if self.keep_rule == "above" else total >= self.keep_threshold

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "RestConfig") -> RestConfig:
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; valid keys are {names}")
        return cls(**data)


@dataclass(frozen=True)
class IterationSummary:
    """What one iteration sampled, kept and trained on (`iter-{k}/summary.json`)."""

    iteration: int
    queries: int
    samples: int
    masked: int  # infra_error rows: no reward, never kept
    rewarded: int  # samples passing the keep rule, before dedupe and cap
    kept: int  # distinct programs trained on
    kept_queries: int  # questions with at least one kept program
    mean_reward: float | None
    status_rates: dict[str, float]
    component_means: dict[str, float]
    zero_variance_groups: int  # questions whose N rewards are all equal (no signal to rank by)
    sft_examples: int
    skipped_too_long: int
    skipped_no_body: int
    train_loss: float | None
    trained: bool
    adapter_source: str  # "previous" | "initial" (restart_from_base)
    seconds: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> IterationSummary:
        return cls(**row)


def iteration_dir(run_dir: str | Path, k: int) -> Path:
    return Path(run_dir) / ITERATIONS_DIR / f"iter-{k}"


def adapter_dir(run_dir: str | Path, k: int) -> Path:
    return iteration_dir(run_dir, k) / "adapter"


def initial_adapter_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / ITERATIONS_DIR / "initial" / "adapter"


def is_done(run_dir: str | Path, k: int) -> bool:
    return (adapter_dir(run_dir, k) / ADAPTER_WEIGHTS).is_file()


def read_summary(run_dir: str | Path, k: int) -> IterationSummary:
    path = iteration_dir(run_dir, k) / "summary.json"
    return IterationSummary.from_json(json.loads(path.read_text(encoding="utf-8")))


def _sync_generator(generator: Any, path: Path) -> None:
    """Generators that hold their own copy of the weights (vLLM) are pointed at the new adapter;
    the transformers generator shares the live model and needs nothing."""
    hook = getattr(generator, "set_adapter", None)
    if callable(hook):
        hook(path)


# --- the loop -------------------------------------------------------------------------------------


def _first_iteration(run_dir: Path, config: RestConfig, start_iteration: int) -> int:
    if start_iteration < 0:
        raise ValueError(f"start_iteration must be >= 0, got {start_iteration}")
    first = start_iteration
    while first < config.iterations and is_done(run_dir, first):
        first += 1
    if first > 0 and not is_done(run_dir, first - 1):
        raise FileNotFoundError(
            f"cannot start the ReST loop at iteration {first}: iteration {first - 1} has no adapter "
            f"({adapter_dir(run_dir, first - 1)})"
        )
    return first


def run_rest(
    *,
    model: Any,
    tokenizer: Any,
    items: list[tuple[Example, str]],
    scorer: ProgramScorer,
    generator: Generator | None,
    config: RestConfig,
    sampling: SamplingConfig,
    run_dir: Path,
    log: RolloutLog,
    prompt_hash: str,
    policy_name: str,
    start_iteration: int = 0,
) -> list[Path]:
    """Run iterations `start_iteration .. config.iterations - 1`, skipping those already done; returns
    the adapter folder of every iteration. `model` is the peft-wrapped policy, trained in place;
    `items` pairs each example with its (unframed) prompt, as the generator takes it. Under several
    processes every one calls this; `generator` is used (and needed) on the main process only."""
    if not items:
        raise ValueError("run_rest: no training items")
    check_sft_overrides(config.sft_overrides)
    run_dir = Path(run_dir)
    state = sft_state(config, run_dir / ITERATIONS_DIR)
    main = state.is_main_process
    if main and generator is None:
        raise ValueError("run_rest: the main process needs a generator")
    first = _first_iteration(run_dir, config, start_iteration)
    state.wait_for_everyone()  # every process has read the folder before the main one writes to it
    initial = initial_adapter_dir(run_dir)
    if first == 0:
        if main:
            initial.parent.mkdir(parents=True, exist_ok=True)
            save_adapter(model, initial)
            _sync_generator(generator, initial)
    else:
        previous = adapter_dir(run_dir, first - 1)
        load_adapter(model, previous)  # every process: they all train from it
        if main:
            _sync_generator(generator, previous)
    if main:
        dropped = log.truncate_after(first - 1 if first > 0 else None)
        if dropped:
            logger.info("rest: dropped %d rollout rows of unfinished iterations (>= %d)", dropped, first)
    state.wait_for_everyone()
    if config.restart_from_base and not (initial / ADAPTER_WEIGHTS).is_file():
        raise FileNotFoundError(f"restart_from_base needs the initial adapter at {initial}")

    bar = tqdm(
        range(first, config.iterations),
        desc="rest iterations",
        initial=first,
        total=config.iterations,
        disable=not main,
    )
    for k in bar:
        sampled = None
        if main:
            sampled = sample_iteration(
                k,
                tokenizer=tokenizer,
                items=items,
                scorer=scorer,
                generator=generator,
                config=config,
                sampling=sampling,
                out=iteration_dir(run_dir, k),
                log=log,
                prompt_hash=prompt_hash,
                policy_name=policy_name,
            )
        # The other processes wait here while the main one samples and scores, then all train on
        # the same examples.
        sampled = broadcast_object_list([sampled], from_process=0)[0]
        timer = sampled["timer"]
        t0 = time.perf_counter()
        source = "previous"
        loss = None
        if sampled["sft_rows"]:
            if config.restart_from_base:
                load_adapter(model, initial)
                source = "initial"
            loss = train_sft(model, tokenizer, sampled["sft_rows"], config, iteration_dir(run_dir, k) / "trainer")
        timer["train"] = time.perf_counter() - t0
        if main:
            summary = IterationSummary(
                **sampled["stats"],
                train_loss=loss,
                trained=bool(sampled["sft_rows"]),
                adapter_source=source,
                seconds={name: round(s, 3) for name, s in timer.items()},
            )
            path = iteration_dir(run_dir, k) / "summary.json"
            path.write_text(json.dumps(summary.to_json(), indent=2) + "\n", encoding="utf-8")
            save_adapter(model, adapter_dir(run_dir, k))  # last: its presence marks the iteration done
            _sync_generator(generator, adapter_dir(run_dir, k))
            bar.set_postfix(
                kept=summary.kept, reward=f"{summary.mean_reward or 0:.3f}", zero_var=summary.zero_variance_groups
            )
        state.wait_for_everyone()  # no process moves on (or returns) before the adapter is on disk
    return [adapter_dir(run_dir, k) for k in range(config.iterations)]
