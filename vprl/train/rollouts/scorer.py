"""Programs in, rewards out: the one path from sampled text to reward every algorithm shares.

`ProgramScorer` runs programs through the executor's runner (sandboxed, deduplicated, cached
tools), composes the configured rewards, and turns the lot into rollout rows. GRPO/RLOO reach it
through the trl adapter, the ReST loop and evaluation call it directly.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
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


@dataclass(frozen=True)
class _Remembered:
    """One scored program, as a row of a `ScoredBatch`."""

    result: ExecutionResult
    total: float | None
    components: dict[str, float | None]
    details: dict[str, list[dict[str, Any]]]


class ProgramScorer:
    """Executes and scores programs. The runner and the composer are owned by the caller (one
    executor per run, started before any model is loaded).

    `remember`: how many scored (example, program) pairs to keep and serve again without running
    them. A repair run scores each episode's final program twice, in the episode loop (to decide
    whether it needs feedback) and through trl's reward functions; the second is then free. Programs
    are deterministic on a fixed tool stack (the tool cache makes their calls equal), so a
    remembered score is the score."""

    def __init__(self, runner: SyncRunner, composer: RewardComposer, remember: int = 0):
        self.runner = runner
        self.composer = composer
        self.remember = remember
        self._memory: OrderedDict[tuple[str, str], _Remembered] = OrderedDict()

    def score(self, examples: Sequence[Example], programs: Sequence[str], progress: bool = False) -> ScoredBatch:
        if len(examples) != len(programs):
            raise ValueError(f"got {len(examples)} examples and {len(programs)} programs")
        todo = self._unknown(examples, programs)
        sub_examples, sub_programs = [examples[i] for i in todo], [programs[i] for i in todo]
        results = self.runner.run(list(zip(sub_examples, sub_programs)), progress=progress) if todo else []
        fresh = ScoredBatch(results, self.composer(sub_examples, results, sub_programs))
        return self._assembled(examples, programs, todo, fresh)

    async def ascore(self, examples: Sequence[Example], programs: Sequence[str]) -> ScoredBatch:
        """The same, awaitable from another event loop (trl runs async reward functions on its own
        loop): execution happens on the runner's loop thread while the caller's loop stays free."""
        todo = self._unknown(examples, programs)
        sub_examples, sub_programs = [examples[i] for i in todo], [programs[i] for i in todo]
        results = (
            await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(
                    self.runner.runner.run(list(zip(sub_examples, sub_programs))), self.runner._loop
                )
            )
            if todo
            else []
        )
        # Composition may itself run programs (unit tests) through the sync runner: keep it off
        # the caller's loop.
        rewards = await asyncio.to_thread(self.composer, sub_examples, results, sub_programs)
        return self._assembled(examples, programs, todo, ScoredBatch(results, rewards))

    def _unknown(self, examples: Sequence[Example], programs: Sequence[str]) -> list[int]:
        if not self.remember:
            return list(range(len(programs)))
        return [i for i, (e, p) in enumerate(zip(examples, programs)) if (e.id, p) not in self._memory]

    def _assembled(
        self, examples: Sequence[Example], programs: Sequence[str], todo: list[int], fresh: ScoredBatch
    ) -> ScoredBatch:
        """The batch in the caller's order: the fresh rows where they were run, the remembered ones
        elsewhere; the fresh ones are remembered."""
        if len(todo) == len(programs) and not self.remember:
            return fresh
        rows: dict[int, _Remembered] = {}
        names = [spec.name for spec, _ in self.composer.functions]
        for j, i in enumerate(todo):
            r = fresh.rewards
            rows[i] = _Remembered(
                fresh.results[j],
                r.totals[j],
                {name: r.components[name][j] for name in names},
                {name: r.details[name][j] for name in r.details},
            )
            if rows[i].result.status != "infra_error":  # our own failure may pass: run it again next time
                self._memory[(examples[i].id, programs[i])] = rows[i]
        for i, (e, p) in enumerate(zip(examples, programs)):
            if i not in rows:
                rows[i] = self._memory[(e.id, p)]
                self._memory.move_to_end((e.id, p))
        while len(self._memory) > self.remember:
            self._memory.popitem(last=False)
        ordered = [rows[i] for i in range(len(programs))]
        detailed = sorted({name for row in ordered for name in row.details})
        rewards = RewardBatch(
            [row.total for row in ordered],
            {name: [row.components.get(name) for row in ordered] for name in names},
            [row.result.status for row in ordered],
            {name: [row.details.get(name, []) for row in ordered] for name in detailed},
        )
        return ScoredBatch([row.result for row in ordered], rewards)

    def metrics(self) -> dict[str, Any]:
        host = getattr(self.runner.runner, "host", None)
        return host.metrics() if host is not None else {}
