"""The rollouts log: one JSON line per sampled program, written every step.

ACE export, evaluation, analysis and plots read it; resume truncates it so that a run killed in
the middle of a step and started again neither loses nor duplicates a row.

A row is written only after its step's update has been applied (or, for the ReST loop, after its
iteration's samples are scored), and every append is flushed and fsynced, so after a crash the
file holds whole rows of finished steps plus at most one torn last line, which `read` drops.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vprl.data.typed import check_row
from vprl.train.runs.jsonl import cut_rows, read_rows, up_to

ROLLOUTS_FILE = "rollouts.jsonl"


@dataclass(frozen=True)
class RolloutRow:
    """One sampled program and what it earned.

    step: the optimizer step (grpo/rloo) or the iteration (rest) whose samples these are.
    components: reward name -> value (None when the component had nothing to say).
    total: the composed reward; None when masked (infra_error).
    tool_calls: the trace, as `ToolCallRecord.to_json()` rows (may be empty to keep logs small).
    unit_tests: the label-free reward's verdict per test (`vprl.rewards.unit_tests.TestOutcome.to_json()`
        rows with the test image's path as "image"), for the run viewer; empty where the run did not
        record them, as in every log written before the field existed.
    """

    step: int
    example_id: str
    prompt_hash: str
    program: str
    status: str
    answer: Any = None
    components: dict[str, float | None] = field(default_factory=dict)
    total: float | None = None
    query: str = ""
    dataset: str = ""
    task: str = ""
    group: str = ""
    program_key: str = ""
    error: str | None = None
    policy: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    unit_tests: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.unit_tests:  # rows stay as they were before the field, for older readers
            del out["unit_tests"]
        return out

    @classmethod
    def from_json(cls, row: dict[str, Any], where: str = "rollout row") -> RolloutRow:
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        check_row(cls, row, where, required=("step", "example_id", "prompt_hash", "program", "status"))
        return cls(**row)


class RolloutLog:
    """Append-only JSONL of `RolloutRow`s in a run folder."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @classmethod
    def in_run(cls, run_dir: str | Path) -> RolloutLog:
        return cls(Path(run_dir) / ROLLOUTS_FILE)

    def append(self, rows: Iterable[RolloutRow]) -> int:
        text = "".join(_dumps(r) + "\n" for r in rows)
        if not text:
            return 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        return text.count("\n")

    def __iter__(self) -> Iterator[RolloutRow]:
        return iter(self.read())

    def read(self) -> list[RolloutRow]:
        """All whole rows. A torn last line (a crash mid-write) is dropped with a warning; a bad
        line anywhere else is an error naming the file and line."""
        return read_rows(self.path, RolloutRow.from_json)

    def last_step(self) -> int | None:
        rows = self.read()
        return max((r.step for r in rows), default=None)

    def truncate_after(self, step: int | None) -> int:
        """Keep only rows with `row.step <= step` (all rows are dropped when step is None), and any
        torn last line; return how many rows were dropped. Resume calls this with the step of the
        checkpoint it restores, so the steps it replays are logged exactly once."""
        return cut_rows(self.path, up_to(step, lambda r: r.step), _dumps, RolloutRow.from_json)


def _dumps(row: RolloutRow) -> str:
    return json.dumps(row.to_json(), ensure_ascii=False)
