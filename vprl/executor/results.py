"""`ExecutionResult`: what running one program on one example produced, with its tool-call trace (plain JSON)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from vprl.data.typed import check_row
from vprl.executor.limits import MAX_TRACE

STATUSES: tuple[str, ...] = (
    "ok",
    "syntax_error",
    "runtime_error",
    "timeout",
    "memory_limit",
    "output_limit",
    "rpc_limit",
    "killed",
    "bad_return",
    "infra_error",  # *our* failure (tool host down, sandbox setup failed): never scored, masked by the trainer
)
PROGRAM_FAILURES = frozenset(STATUSES) - {"ok", "infra_error"}


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool call of a program, for traces: name, arguments, a short result, cache hit, time,
    and the line of the program (1-based, in the source as submitted) the call was made from.

    `line` is None where it is not known: rows written before the field existed, or a request that
    came without a usable line (the program's side of the channel reports it, see `program_line`).
    """

    tool: str
    args: dict[str, Any]
    box: list[int] | None
    result: str
    cached: bool = False
    seconds: float = 0.0
    line: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any], where: str = "tool call") -> ToolCallRecord:
        check_row(cls, row, where)
        return cls(**row)


def short_result(result: Any, limit: int = MAX_TRACE) -> str:
    """A trace-sized rendering of a tool result."""
    text = json.dumps(result, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class ExecutionResult:
    example_id: str
    program_key: str
    status: str
    answer: Any = None
    error: str | None = None
    duration_s: float = 0.0
    tool_calls: tuple[ToolCallRecord, ...] = field(default_factory=tuple)
    stdout: str = ""
    # Seconds the program spent waiting on the tool host (part of duration_s, not of its budget).
    # Rows written before this field existed read back as 0.0.
    rpc_wait_s: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown execution status {self.status!r}; valid: {STATUSES}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["tool_calls"] = [c.to_json() for c in self.tool_calls]
        return out

    @classmethod
    def from_json(cls, row: dict[str, Any], where: str = "ExecutionResult") -> ExecutionResult:
        check_row(
            cls,
            {k: v for k, v in row.items() if k != "tool_calls"},
            where,
            required=("example_id", "program_key", "status"),
        )
        row = dict(row)
        calls = row.get("tool_calls", ())
        if not isinstance(calls, list | tuple):
            raise ValueError(f"{where}: tool_calls: expected a list, got {type(calls).__name__}")
        row["tool_calls"] = tuple(
            ToolCallRecord.from_json(c, f"{where}: tool_calls[{i}]") for i, c in enumerate(calls)
        )
        return cls(**row)
