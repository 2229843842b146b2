"""The executor's settings as every command names them: the tool stack, its overrides and service,
and the sandbox's slots, program time, isolation and tool-call budget. One dataclass, shared by the RL
recipe, the evaluation, the bootstrap, `python -m vprl.executor.run` and `program_rewards`, checked
here and parsed here into its real types (docs/configs.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from vprl.executor.runner_config import SANDBOX_MODES, RunnerConfig


@dataclass
class ExecutorArgs:
    """Where programs run and with which tools."""

    tool_stack: str = field(
        default="shapes",
        metadata={"help": "a named stack (shapes, oracle, viunit, vipergpt, stanic) or a stack YAML's path"},
    )
    # Declared as text for the argument parser's sake (a command line gives YAML text, a file a
    # mapping); `__post_init__` leaves a dict.
    tool_overrides: str | None = field(
        default=None,
        metadata={"help": "mapping of backend settings replacing the stack's, e.g. {scene_graphs: path}"},
    )
    tool_service: str | None = field(
        default=None,
        metadata={"help": "Ray address of the stack deployed by `vprl serve` (auto: this node; none: in-process)"},
    )
    executor_slots: int | None = field(default=None, metadata={"help": "sandboxes in parallel (none: the cores)"})
    executor_timeout_s: float = field(
        default=5.0,
        metadata={
            "help": "seconds of a program's own time (tool waits excluded); the runner also stops it 115 s after its "
            "first tool call (wall_timeout_s)"
        },
    )
    executor_sandbox: str = field(
        default="auto",
        metadata={
            "help": "auto (full where namespaces work, else restricted) | full | restricted | none (debugging only)"
        },
    )
    executor_max_rpcs: int = field(
        default=200, metadata={"help": "tool calls a program may make before it is stopped"}
    )

    def __post_init__(self) -> None:
        # The parser hands a command line's mapping over as text; from here on it is a dict.
        overrides = self.tool_overrides
        if isinstance(overrides, str):
            try:
                overrides = yaml.safe_load(overrides)
            except yaml.YAMLError as exc:
                raise ValueError(f"tool_overrides: cannot parse {self.tool_overrides!r}: {exc}") from None
        if overrides is None:
            overrides = {}
        if not isinstance(overrides, dict):
            raise ValueError(f"tool_overrides: expected a mapping of stack settings, got {overrides!r:.80}")
        self.tool_overrides = overrides
        if not isinstance(self.tool_stack, str) or not self.tool_stack:
            raise ValueError(f"tool_stack: expected a stack's name or path, got {self.tool_stack!r}")
        if self.executor_sandbox not in SANDBOX_MODES:
            raise ValueError(f"executor_sandbox: {self.executor_sandbox!r} is not one of {', '.join(SANDBOX_MODES)}")
        if self.executor_slots is not None and self.executor_slots < 1:
            raise ValueError(f"executor_slots: must be at least 1, got {self.executor_slots}")
        if not self.executor_timeout_s > 0:
            raise ValueError(f"executor_timeout_s: must be > 0, got {self.executor_timeout_s}")
        if self.executor_max_rpcs < 1:
            raise ValueError(f"executor_max_rpcs: must be at least 1, got {self.executor_max_rpcs}")

    def runner_config(self, **more: Any) -> RunnerConfig:
        """The batch runner's settings (`more`: its other fields, e.g. wall_timeout_s)."""
        return RunnerConfig(
            slots=self.executor_slots or (os.cpu_count() or 1),
            timeout_s=self.executor_timeout_s,
            max_rpcs=self.executor_max_rpcs,
            sandbox=self.executor_sandbox,
            **more,
        )
