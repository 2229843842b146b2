"""Programs in, rewards out: the one path from sampled text to reward every algorithm shares.

`ProgramScorer` runs programs through the executor's runner (sandboxed, deduplicated, cached
tools), composes the configured rewards, and turns the lot into rollout rows. GRPO/RLOO reach it
through the trl adapter, the ReST loop and evaluation call it directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vprl.data.records import Example
from vprl.executor.results import ExecutionResult
from vprl.executor.runner import SyncRunner
from vprl.rewards.compose import RewardBatch, RewardComposer
from vprl.train.rollouts.log import RolloutRow


@dataclass(frozen=True)
class ScoredBatch:
    results: list[ExecutionResult]
    rewards: RewardBatch

    def rows(
        self,
        step: int,
        examples: Sequence[Example],
        programs: Sequence[str],
        prompt_hash: str,
        policy: str = "",
        keep_trace: bool = True,
    ) -> list[RolloutRow]:
        out = []
        # The label-free reward's verdict per test, where the run has it (`RewardBatch.details`);
        # kept or left out with the traces: both are the run viewer's evidence.
        tests = self.rewards.details.get("unit_tests") if keep_trace else None
        for i, (example, program, result) in enumerate(zip(examples, programs, self.results, strict=True)):
            out.append(
                RolloutRow(
                    step=step,
                    example_id=example.id,
                    prompt_hash=prompt_hash,
                    program=program,
                    status=result.status,
                    answer=result.answer,
                    components={name: values[i] for name, values in self.rewards.components.items()},
                    total=self.rewards.totals[i],
                    query=example.query,
                    dataset=example.dataset,
                    task=example.task,
                    group=example.group or "",
                    program_key=result.program_key,
                    error=result.error,
                    policy=policy,
                    tool_calls=[c.to_json() for c in result.tool_calls] if keep_trace else [],
                    unit_tests=list(tests[i]) if tests else [],
                )
            )
        return out


class ProgramScorer:
    """Executes and scores programs. The runner and the composer are owned by the caller (one
    executor per run, started before any model is loaded)."""

    def __init__(self, runner: SyncRunner, composer: RewardComposer):
        self.runner = runner
        self.composer = composer

    def score(self, examples: Sequence[Example], programs: Sequence[str], progress: bool = False) -> ScoredBatch:
        if len(examples) != len(programs):
            raise ValueError(f"got {len(examples)} examples and {len(programs)} programs")
        results = self.runner.run(list(zip(examples, programs)), progress=progress)
        return ScoredBatch(results, self.composer(examples, results, programs))

    async def ascore(self, examples: Sequence[Example], programs: Sequence[str]) -> ScoredBatch:
        """The same, awaitable from another event loop (trl runs async reward functions on its own
        loop): execution happens on the runner's loop thread while the caller's loop stays free."""
        results = await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(self.runner.runner.run(list(zip(examples, programs))), self.runner._loop)
        )
        # Composition may itself run programs (unit tests) through the sync runner: keep it off
        # the caller's loop.
        rewards = await asyncio.to_thread(self.composer, examples, results, programs)
        return ScoredBatch(results, rewards)

    def metrics(self) -> dict[str, Any]:
        host = getattr(self.runner.runner, "host", None)
        return host.metrics() if host is not None else {}
