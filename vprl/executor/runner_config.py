"""How the batch runner runs programs: sandbox slots, limits and the two clocks of a program.

`timeout_s` counts the program's own time (the supervisor stops its clock while the program waits on
the tool host); `wall_timeout_s` counts everything from the program's first tool request on, tool
waits included, so no program holds its slot longer than their sum. Why two, and the values:
docs/design-notes.md, "Program timeouts".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from vprl.executor.sandbox.child import Limits
from vprl.executor.sandbox.probe import LAYERS
from vprl.executor.sandbox.spawning import SPAWN_MODES

# "full": every isolation layer, namespaces included, or refuse to start; "restricted": no
# namespaces (docs/design-notes.md#the-sandbox-without-namespaces); "auto": full where the probe finds
# every required layer, else restricted, announced in one line; "none": in-process, debugging only.
SANDBOX_MODES = ("auto", "full", "restricted", "none")


@dataclass(frozen=True)
class RunnerConfig:
    slots: int = field(default_factory=lambda: os.cpu_count() or 1)
    timeout_s: float = 5.0  # per program, not counting time spent waiting on the tool host
    # From the program's first tool request on, tool waits included: with the default `timeout_s`,
    # 120 s in all, the bound [U] C.3 puts on a program with its model calls.
    wall_timeout_s: float = 115.0
    rpc_timeout_s: float = 30.0  # one tool call; past it the call is an infra failure
    max_rpcs: int = 200  # tool calls (and pixel requests) per program
    sandbox: str = "auto"
    limits: Limits = field(default_factory=Limits)
    require_layers: tuple[str, ...] = LAYERS  # what "full" (and "auto", to choose full) needs
    memo_size: int = 50_000
    # How a sandbox is started (same layers either way; see vprl/executor/sandbox/child.py): "clone" = one
    # clone(2) into the new namespaces and a per-slot empty network namespace (fast); "fork" = the
    # original fork + unshare + fork with a fresh network namespace per program.
    spawn: str = "clone"

    def __post_init__(self) -> None:
        if self.sandbox not in SANDBOX_MODES:
            raise ValueError(f"sandbox must be one of {SANDBOX_MODES}, got {self.sandbox!r}")
        if self.spawn not in SPAWN_MODES:
            raise ValueError(f"spawn must be one of {SPAWN_MODES}, got {self.spawn!r}")
        if self.slots < 1:
            raise ValueError(f"slots must be >= 1, got {self.slots}")
        if self.wall_timeout_s <= 0:
            raise ValueError(f"wall_timeout_s must be > 0, got {self.wall_timeout_s:g}")

    @property
    def longest_hold_s(self) -> float:
        """The longest a program can keep its slot (and a training step waiting on it)."""
        return self.timeout_s + self.wall_timeout_s
