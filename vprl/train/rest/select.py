"""One ReST iteration's sampling and selection: each process samples N programs per question of its
shard and scores them (`sample_shard`); from the rows of every shard, in question order, every
process keeps the same rewarded ones (keep rule, per-question dedupe by `program_key`,
`max_kept_per_query` cap) and builds the same SFT examples and summary counts (`select_iteration`).
The loop around it (resume, the exchange, training, adapters, writing) is `vprl.train.rest`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vprl.data.records import Example
from vprl.executor.program import program_key
from vprl.rewards.groups import is_zero_variance
from vprl.train.prompts import completion_to_program
from vprl.train.recipe.sections import RestArgs
from vprl.train.repair.turns import RepairConfig
from vprl.train.rest.episodes import sample_episodes
from vprl.train.rest.sft import sft_example
from vprl.train.rollouts.log import RolloutRow
from vprl.train.rollouts.scorer import ProgramScorer
from vprl.train.sampling.generator import Generator, SamplingSettings

__all__ = [
    "KeptProgram",
    "Shard",
    "merge_contexts",
    "merge_shards",
    "sample_shard",
    "select_iteration",
    "select_kept",
    "write_kept",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeptProgram:
    item: int  # index into run_rest's items
    example_id: str
    program: str
    total: float
    context: str | None = None  # a repaired episode's conversation before its final program


def select_kept(
    rows: Sequence[RolloutRow],
    items_per_row: Sequence[int],
    rest: RestArgs,
    contexts: Sequence[str | None] | None = None,
) -> list[KeptProgram]:
    """The training set of one iteration: rows passing the keep rule, deduplicated per question by
    program key, best reward first (sample order breaks ties), at most `rest_max_kept_per_query`.
    With repair episodes, `contexts` holds each row's conversation before its final program."""
    by_item: dict[int, list[tuple[int, RolloutRow]]] = defaultdict(list)
    for order, (row, item) in enumerate(zip(rows, items_per_row, strict=True)):
        if rest.keeps(row.total):
            by_item[item].append((order, row))
    kept: list[KeptProgram] = []
    for item in sorted(by_item):
        ranked = sorted(by_item[item], key=lambda pair: (-pair[1].total, pair[0]))
        seen: set[str] = set()
        for order, row in ranked:
            key = row.program_key or program_key(row.program)
            if rest.rest_dedupe and key in seen:
                continue
            seen.add(key)
            context = contexts[order] if contexts is not None else None
            kept.append(KeptProgram(item, row.example_id, row.program, float(row.total), context))
            if rest.rest_max_kept_per_query is not None and len(seen) >= rest.rest_max_kept_per_query:
                break
    return kept


def summarise(k: int, rows: list[RolloutRow], groups: list[list[float | None]], queries: int) -> dict[str, Any]:
    totals = [r.total for r in rows if r.total is not None]
    statuses = Counter(r.status for r in rows)
    components: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        for name, value in r.components.items():
            if value is not None:
                components[name].append(value)
    return {
        "iteration": k,
        "queries": queries,
        "samples": len(rows),
        "masked": len(rows) - len(totals),
        "mean_reward": sum(totals) / len(totals) if totals else None,
        "status_rates": {s: c / len(rows) for s, c in sorted(statuses.items())} if rows else {},
        "component_means": {n: sum(v) / len(v) for n, v in sorted(components.items())},
        "zero_variance_groups": sum(is_zero_variance(g) for g in groups),
    }


@dataclass(frozen=True)
class Shard:
    """What one process sampled and scored: its questions (indices into the loop's items) and their
    rows, `n` per question in question order."""

    items: list[int]
    rows: list[RolloutRow]
    seconds: dict[str, float]
    contexts: list[str | None] | None = None  # with repair episodes (`vprl.train.rest.episodes`)


def sample_shard(
    k: int,
    *,
    items: list[tuple[Example, str]],
    indices: list[int],
    scorer: ProgramScorer,
    generator: Generator,
    sampling: SamplingSettings,
    prompt_hash: str,
    policy_name: str,
    progress: bool = True,
    repair: RepairConfig | None = None,
) -> Shard:
    """Sample `sampling.n` programs for each question of `indices` (seeded with the iteration) and
    score them through this process's executor; with `repair` (more than one turn), each sample is
    an episode whose final program is the row (`vprl.train.rest.episodes`)."""
    examples = [items[i][0] for i in indices]
    prompts = [items[i][1] for i in indices]
    n = sampling.n
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    iter_sampling = sampling if sampling.seed is None else dataclasses.replace(sampling, seed=sampling.seed + k)
    completions = generator.generate(prompts, iter_sampling)
    if len(completions) != len(prompts) or any(len(c) != n for c in completions):
        raise RuntimeError(f"generator returned {[len(c) for c in completions]} completions, expected {n} per prompt")
    seconds["generate"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    programs = [completion_to_program(prompts[j], c) for j in range(len(indices)) for c in completions[j]]
    flat_examples = [examples[j] for j in range(len(indices)) for _ in range(n)]
    if repair is not None and repair.max_turns > 1:
        flat_prompts = [prompts[j] for j in range(len(indices)) for _ in range(n)]
        rows, contexts, _ = sample_episodes(
            k,
            flat_examples,
            flat_prompts,
            programs,
            scorer=scorer,
            generator=generator,
            sampling=iter_sampling,
            repair=repair,
            prompt_hash=prompt_hash,
            policy_name=policy_name,
        )
        seconds["score"] = time.perf_counter() - t0  # the later turns' sampling included
        return Shard(list(indices), rows, seconds, contexts)
    batch = scorer.score(flat_examples, programs, progress=progress)
    rows = batch.rows(k, flat_examples, programs, prompt_hash=prompt_hash, policy=policy_name)
    seconds["score"] = time.perf_counter() - t0
    return Shard(list(indices), rows, seconds)


def merge_contexts(shards: Sequence[Shard], n: int, questions: int) -> list[str | None] | None:
    """The shards' repair contexts in the order `merge_shards` puts their rows; None without repair."""
    if all(shard.contexts is None for shard in shards):
        return None
    by_item: dict[int, list[str | None]] = {}
    for shard in shards:
        contexts = shard.contexts if shard.contexts is not None else [None] * len(shard.rows)
        for j, item in enumerate(shard.items):
            by_item[item] = contexts[j * n : (j + 1) * n]
    return [c for i in range(questions) for c in by_item[i]]


def merge_shards(shards: Sequence[Shard], n: int, questions: int) -> tuple[list[RolloutRow], list[int]]:
    """Every shard's rows in question order, as one process sampling everything would have them, and
    the question of each row; each question must come from exactly one shard."""
    by_item: dict[int, list[RolloutRow]] = {}
    for shard in shards:
        if len(shard.rows) != n * len(shard.items):
            raise RuntimeError(f"a shard has {len(shard.rows)} rows for {len(shard.items)} questions x {n} samples")
        for j, item in enumerate(shard.items):
            if item in by_item:
                raise RuntimeError(f"question {item} was sampled by two processes")
            by_item[item] = shard.rows[j * n : (j + 1) * n]
    if sorted(by_item) != list(range(questions)):
        raise RuntimeError(f"the shards hold {len(by_item)} of {questions} questions")
    return [r for i in range(questions) for r in by_item[i]], [i for i in range(questions) for _ in range(n)]


def select_iteration(
    k: int,
    *,
    tokenizer: Any,
    items: list[tuple[Example, str]],
    rows: list[RolloutRow],
    flat_items: list[int],
    rest: RestArgs,
    n: int,
    style: str,
    max_length: int | None,
    contexts: Sequence[str | None] | None = None,
) -> dict[str, Any]:
    """The kept programs, the SFT examples and the summary's counts of iteration k, from the rows of
    every question (`merge_shards`). Deterministic: every process gets the same from the same rows."""
    prompts = [p for _, p in items]
    groups = [[r.total for r in rows[i * n : (i + 1) * n]] for i in range(len(items))]
    stats = summarise(k, rows, groups, len(items))
    rewarded = sum(rest.keeps(r.total) for r in rows)
    kept = select_kept(rows, flat_items, rest, contexts)
    sft_rows, too_long, no_body = [], 0, 0
    for kp in kept:
        ex = sft_example(tokenizer, kp.context or prompts[kp.item], kp.program, style)
        if ex is None:  # rewarded yet no `def execute_command` line first: nothing to continue
            no_body += 1
            continue
        if max_length is not None and len(ex["input_ids"]) > max_length:
            too_long += 1
            continue
        sft_rows.append(ex)
    if too_long:
        logger.warning(
            "rest iteration %d: %d kept programs are longer than max_length %d with their prompt; left out",
            k,
            too_long,
            max_length,
        )
    if not sft_rows:
        logger.warning(
            "rest iteration %d: nothing to train on (%d of %d samples passed the keep rule); "
            "the adapter is carried over unchanged",
            k,
            rewarded,
            len(rows),
        )
    return {
        "kept": kept,
        "sft_rows": sft_rows,
        "stats": {
            **stats,
            "rewarded": rewarded,
            "kept": len(kept),
            "kept_queries": len({kp.item for kp in kept}),
            "sft_examples": len(sft_rows),
            "skipped_too_long": too_long,
            "skipped_no_body": no_body,
        },
    }


def write_kept(out: Path, kept: Sequence[KeptProgram]) -> None:
    """`out/kept.jsonl` (`out`: the iteration's folder)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "kept.jsonl").write_text(
        "".join(json.dumps(dataclasses.asdict(kp), ensure_ascii=False) + "\n" for kp in kept), encoding="utf-8"
    )
