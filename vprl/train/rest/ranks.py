"""The processes of a ReST run (`accelerate launch --num_processes N`): which questions each one
samples and scores, and the exchange of what they scored.

Each process takes every N-th question (its shard; a strided one, so a dataset sorted by family or
difficulty still spreads evenly), samples and scores it with its own generator and executor, and the
scored rows of all shards are gathered to every process. Every process then selects the kept set
from the same rows in the same order, so all train on the same examples, as DDP needs.

The gather runs on a gloo group of its own, with its own timeout: a process that finished its shard
waits there for the slowest one, and that wait scales with the shard, not with the recipe's
`ddp_timeout` (30 minutes by default), which only the short serial steps (the main process writing
the rollouts, the summary and the adapter) now have to fit. Waiting on gloo also keeps the pickled
rows off the GPU and out of reach of NCCL's watchdog, which times out pending collectives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any


@dataclass
class Ranks:
    index: int
    count: int
    group: Any = None  # the gloo group of the gather (None: one process)
    timeout_s: float | None = None

    @classmethod
    def open(cls, state: Any, timeout_s: float) -> Ranks:
        """This process's place among `state`'s (accelerate's `PartialState`); under several
        processes every one must call this, in the same order as its other collectives."""
        if state.num_processes == 1:
            return cls(0, 1)
        import torch.distributed as dist

        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        return cls(state.process_index, state.num_processes, group, timeout_s)

    def shard(self, n: int) -> list[int]:
        """The indices of this process's questions among `n`."""
        if n < self.count:
            raise ValueError(f"run_rest: {n} questions cannot be shared by {self.count} processes (one at least each)")
        return list(range(self.index, n, self.count))

    def gather(self, obj: Any) -> list[Any]:
        """Every process's `obj`, in process order, on every process."""
        if self.group is None:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.count
        dist.all_gather_object(out, obj, group=self.group)
        return out


def gather_timeout_s(ddp_timeout: float, questions: int, processes: int, samples: int, runner: Any) -> float:
    """How long a process may wait in the gather: the recipe's `ddp_timeout` (for the generation and
    the tool waits) plus the longest the executor may take for one shard's programs, run `slots` at
    a time, each stopped at its deadline (`timeout_s`)."""
    config = runner.runner.config
    programs = math.ceil(questions / processes) * samples
    return float(ddp_timeout) + math.ceil(programs / config.slots) * config.timeout_s
