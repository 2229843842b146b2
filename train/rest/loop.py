"""The ReST loop (ViUniT / ViReP's "RL"): sample N programs per question, score them through the
executor, keep the rewarded ones, fine-tune the LoRA on them with trl's SFTTrainer, repeat K times,
one adapter per iteration.

How it differs from ViUniT's released code, and why: docs/design-notes.md#rest-versus-viunit.

Files: `train.rest.iterations`. An iteration's adapter folder appears last (renamed into place), so
its presence marks the iteration done: resume skips it, reloads the last done adapter and truncates
the rollouts log after that iteration.

Several processes (`accelerate launch --num_processes N`): the main process alone samples, scores,
writes the rollouts log and saves adapters and summaries; the SFT examples it built are broadcast,
and every process runs the SFT step (trl's trainer wraps the model in DDP, so gradients are
averaged and every copy of the adapter stays the same).

Sampling, scoring and selecting one iteration's training set is `train.rest.select`; the SFT step
is `train.rest.sft`.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from accelerate.utils import broadcast_object_list
from tqdm.auto import tqdm

from data.records import Example
from train.recipe.sections import RestArgs
from train.rest.iterations import (
    ADAPTER_WEIGHTS,
    ITERATIONS_DIR,
    IterationSummary,
    adapter_dir,
    initial_adapter_dir,
    is_done,
    iteration_dir,
)
from train.rest.select import sample_iteration
from train.rest.sft import load_adapter, save_adapter, sft_state, train_sft
from train.rollouts.log import RolloutLog
from train.rollouts.scorer import ProgramScorer
from train.sampling.generator import Generator, policy_sampling, sampling_fields

logger = logging.getLogger(__name__)


def _sync_generator(generator: Any, path: Path) -> None:
    """Generators that hold their own copy of the weights (vLLM) are pointed at the new adapter;
    the transformers generator shares the live model and needs nothing."""
    hook = getattr(generator, "set_adapter", None)
    if callable(hook):
        hook(path)


def _first_iteration(run_dir: Path, iterations: int, start_iteration: int) -> int:
    if start_iteration < 0:
        raise ValueError(f"start_iteration must be >= 0, got {start_iteration}")
    first = start_iteration
    while first < iterations and is_done(run_dir, first):
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
    rest: RestArgs,
    sft: Any,
    style: str,
    run_dir: Path,
    log: RolloutLog,
    prompt_hash: str,
    policy_name: str,
    start_iteration: int = 0,
) -> list[Path]:
    """Run iterations `start_iteration .. rest_iterations - 1`, skipping those already done; returns
    the adapter folder of every iteration. `model` is the peft-wrapped policy, trained in place;
    `items` pairs each example with its (unframed) prompt, as the generator takes it; `sft` is the
    recipe's `SFTConfig` (`train.recipe.trainer_args.SFTArgs`), `style` the policy's prompt framing.
    Under several processes every one calls this; `generator` is used (and needed) on the main
    process only."""
    if not items:
        raise ValueError("run_rest: no training items")
    run_dir = Path(run_dir)
    state = sft_state(sft, run_dir / ITERATIONS_DIR)
    main = state.is_main_process
    if main and generator is None:
        raise ValueError("run_rest: the main process needs a generator")
    first = _first_iteration(run_dir, rest.rest_iterations, start_iteration)
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
    if rest.rest_restart_from_base and not (initial / ADAPTER_WEIGHTS).is_file():
        raise FileNotFoundError(f"restart_from_base needs the initial adapter at {initial}")

    sampling = policy_sampling(**sampling_fields(rest, "rest_"), n=rest.rest_samples_per_query, seed=sft.seed)
    bar = tqdm(
        range(first, rest.rest_iterations),
        desc="rest iterations",
        initial=first,
        total=rest.rest_iterations,
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
                rest=rest,
                sampling=sampling,
                style=style,
                max_length=sft.max_length,
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
            if rest.rest_restart_from_base:
                load_adapter(model, initial)
                source = "initial"
            loss = train_sft(model, tokenizer, sampled["sft_rows"], sft, iteration_dir(run_dir, k) / "trainer")
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
    return [adapter_dir(run_dir, k) for k in range(rest.rest_iterations)]
