"""The ReST run folder: one folder per iteration, and what each iteration sampled, kept and trained on.

run_dir/iterations/initial/adapter         the policy's adapter before iteration 0
run_dir/iterations/iter-{k}/adapter/       the adapter after iteration k (renamed into place last,
                                           so its presence marks the iteration done)
run_dir/iterations/iter-{k}/summary.json   `IterationSummary`
run_dir/iterations/iter-{k}/kept.jsonl     the kept programs (`vprl.train.rest.select.KeptProgram`)
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vprl.train.runs.folder import ADAPTER_WEIGHTS

ITERATIONS_DIR = "iterations"


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
