"""The ReST loop (ViUniT / ViReP's "RL"): sample N programs per question, score them through the
executor, keep the rewarded ones, fine-tune the LoRA on them with trl's SFTTrainer, repeat K times,
one adapter per iteration.

How it differs from ViUniT's released code, and why: docs/design-notes.md#rest-versus-viunit.

Files: `vprl.train.rest.iterations`. An iteration's adapter folder appears last (renamed into place), so
its presence marks the iteration done: resume skips it, reloads the last done adapter and truncates
the rollouts log after that iteration.

Several processes (`accelerate launch --num_processes N`): each samples and scores its shard of the
questions with its own generator and executor (`vprl.train.rest.ranks`); the scored rows are gathered to
every process, each selects the same kept set from them, and every process runs the SFT step (trl's
trainer wraps the model in DDP, so gradients are averaged and every copy of the adapter stays the
same). The main process alone writes the rollouts log, `kept.jsonl`, the summaries and the adapters;
the others wait for it in collectives bounded by the recipe's `ddp_timeout`, which those writes
(seconds) fit easily. The wait for the slowest shard has its own timeout (`ranks.gather_timeout_s`).

Sampling, scoring and selecting one iteration's training set is `vprl.train.rest.select`; the SFT step
is `vprl.train.rest.sft`.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from vprl.data.records import Example
from vprl.train.recipe.sections import RestArgs, SamplingArgs
from vprl.train.repair.turns import RepairConfig
from vprl.train.rest.iterations import (
    ADAPTER_WEIGHTS,
    ITERATIONS_DIR,
    IterationSummary,
    adapter_dir,
    initial_adapter_dir,
    is_done,
    iteration_dir,
)
from vprl.train.rest.ranks import Ranks
from vprl.train.rest.select import merge_contexts, merge_shards, sample_shard, select_iteration, write_kept
from vprl.train.rest.sft import load_adapter, save_adapter, sft_state, train_sft
from vprl.train.rollouts.log import RolloutLog
from vprl.train.rollouts.scorer import ProgramScorer
from vprl.train.sampling.generator import Generator

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
    generator: Generator,
    rest: RestArgs,
    sft: Any,
    sampling: SamplingArgs | None = None,
    style: str,
    run_dir: Path,
    log: RolloutLog,
    prompt_hash: str,
    policy_name: str,
    start_iteration: int = 0,
    gather_timeout_s: float | None = None,
    repair: RepairConfig | None = None,
) -> list[Path]:
    """Run iterations `start_iteration .. rest_iterations - 1`, skipping those already done; returns
    the adapter folder of every iteration. `model` is the peft-wrapped policy, trained in place;
    `items` pairs each example with its (unframed) prompt, as the generator takes it; `sft` is the
    recipe's `SFTConfig` (`vprl.train.recipe.trainer_args.SFTArgs`), `sampling` the recipe's sampling keys
    (default: the papers'), `style` the policy's prompt framing.
    Under several processes every one calls this with the same items and its own generator and
    scorer; `gather_timeout_s` bounds the wait for the slowest shard (default: `sft.ddp_timeout`)."""
    if not items:
        raise ValueError("run_rest: no training items")
    if generator is None:
        raise ValueError("run_rest: every process samples its shard and needs a generator")
    run_dir = Path(run_dir)
    state = sft_state(sft, run_dir / ITERATIONS_DIR)
    main = state.is_main_process
    first = _first_iteration(run_dir, rest.rest_iterations, start_iteration)
    ranks = Ranks.open(state, gather_timeout_s if gather_timeout_s is not None else sft.ddp_timeout)
    shard = ranks.shard(len(items))
    if main and ranks.count > 1:
        logger.info(
            "rest: %d processes sample and score every %d-th question each; the gather waits up to %.0f s for the "
            "slowest",
            ranks.count,
            ranks.count,
            ranks.timeout_s,
        )
    state.wait_for_everyone()  # every process has read the folder before the main one writes to it
    initial = initial_adapter_dir(run_dir)
    if first == 0:
        if main:
            initial.parent.mkdir(parents=True, exist_ok=True)
            save_adapter(model, initial)
        serving = initial
    else:
        serving = adapter_dir(run_dir, first - 1)
        load_adapter(model, serving)  # every process: they all train from it
    if main:
        dropped = log.truncate_after(first - 1 if first > 0 else None)
        if dropped:
            logger.info("rest: dropped %d rollout rows of unfinished iterations (>= %d)", dropped, first)
    state.wait_for_everyone()
    _sync_generator(generator, serving)  # on disk now, for every process's sampler
    if rest.rest_restart_from_base and not (initial / ADAPTER_WEIGHTS).is_file():
        raise FileNotFoundError(f"restart_from_base needs the initial adapter at {initial}")

    sampling = (sampling or SamplingArgs()).settings(seed=sft.seed)
    bar = tqdm(
        range(first, rest.rest_iterations),
        desc="rest iterations",
        initial=first,
        total=rest.rest_iterations,
        disable=not main,
    )
    for k in bar:
        mine = sample_shard(
            k,
            items=items,
            indices=shard,
            scorer=scorer,
            generator=generator,
            sampling=sampling,
            prompt_hash=prompt_hash,
            policy_name=policy_name,
            progress=main,  # one progress bar, not one per process
            repair=repair,
        )
        shards = ranks.gather(mine)  # every process waits here for the slowest shard
        rows, flat_items = merge_shards(shards, sampling.n, len(items))
        contexts = merge_contexts(shards, sampling.n, len(items))
        # The phase lasted as long as its slowest process.
        timer = {name: max(s.seconds[name] for s in shards) for name in ("generate", "score")}
        t0 = time.perf_counter()
        sampled = select_iteration(
            k,
            tokenizer=tokenizer,
            items=items,
            rows=rows,
            flat_items=flat_items,
            rest=rest,
            n=sampling.n,
            style=style,
            max_length=sft.max_length,
            contexts=contexts,
        )
        if main:
            log.append(rows)
            write_kept(iteration_dir(run_dir, k), sampled["kept"])
        timer["select"] = time.perf_counter() - t0
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
            bar.set_postfix(
                kept=summary.kept, reward=f"{summary.mean_reward or 0:.3f}", zero_var=summary.zero_variance_groups
            )
        state.wait_for_everyone()  # no process moves on (or returns) before the adapter is on disk
        _sync_generator(generator, adapter_dir(run_dir, k))
    return [adapter_dir(run_dir, k) for k in range(rest.rest_iterations)]
