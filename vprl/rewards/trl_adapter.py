"""The composed reward as trl's `reward_funcs`: one executor run per completion batch, shared.

trl calls every reward function with the batch's prompts, completions and dataset columns, and
sums `reward_weights[i] * reward_i`. `TrlRewardAdapter.reward_funcs` gives:

- `total` (weight 1): the composer's total: the weighted components for a program that ran, the
  status penalty for one that failed, None for `infra_error`. Every function returns None there,
  so trl counts the completion as unscorable: out of the group baseline, advantage 0.
- one function per component (weight 0): the component's value, so trl logs `rewards/<name>/mean`
  and shows it in the completions table without it entering the advantage twice. A program that
  failed to run scores 0 there (it answered nothing, so no component credits it; the composer
  leaves it None, since the total is the status penalty). trl's mean skips None: with None,
  `rewards/correctness/mean` averaged only the programs that ran, an accuracy above the policy's
  (80 % where half the programs crash is 40 % of the questions); with 0 it is the share of every
  scored program's answers that were right. None stays for `infra_error` (nobody scored it) and
  where a component had nothing to say about a program that ran.

All of them are async (trl gathers async reward functions on its own event loop): the first to
start runs the batch through the scorer (sandboxed execution on the executor's loop, composition
in a worker thread) and the others await the same result, so each batch executes once.

Overlap: `prefetch` starts a batch's scoring as soon as its completions exist, while trl computes
the old and reference log-probabilities; the reward functions then take the running task. How
batches are matched and bounded: docs/design-notes.md#overlap.

Layering: rewards never imports train; the caller hands in `to_program` (completion -> program
source) and a scorer with `async ascore(examples, programs)` returning `.results` and `.rewards`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from vprl.data.records import Example
from vprl.executor.results import PROGRAM_FAILURES, STATUSES, ExecutionResult
from vprl.rewards.compose import RewardBatch
from vprl.rewards.diagnostics import diagnostics

TOTAL = "total"
logger = logging.getLogger(__name__)


class InfraFailure(RuntimeError):
    """Our side (executor, sandbox, tools) failed every program of several batches in a row."""


class Scored(Protocol):
    results: list[ExecutionResult]
    rewards: RewardBatch


class Scorer(Protocol):
    async def ascore(self, examples: Sequence[Example], programs: Sequence[str]) -> Scored: ...

    def metrics(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ScoredCompletions:
    """One scored batch, handed to `on_batch` (the trainer turns it into rollout rows).

    global_step: optimizer steps finished when the batch was sampled (its samples train the next).
    """

    global_step: int
    prompts: list[str]
    completions: list[str]
    examples: list[Example]
    programs: list[str]
    scored: Scored


@dataclass(frozen=True)
class BatchTiming:
    """Wall time of one batch's scoring (execution and composition) and how much of it the reward
    call waited for; the rest ran hidden behind what the trainer did between generation and rewards."""

    prefetched: bool
    scoring_s: float
    waited_s: float

    @property
    def hidden_s(self) -> float:
        return max(self.scoring_s - self.waited_s, 0.0)

    def to_json(self) -> dict[str, Any]:
        return {"prefetched": self.prefetched, "scoring_s": self.scoring_s, "waited_s": self.waited_s}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BatchTiming:
        return cls(bool(data["prefetched"]), float(data["scoring_s"]), float(data["waited_s"]))


@dataclass(frozen=True)
class _Executed:
    examples: list[Example]
    programs: list[str]
    scored: Scored
    finished: float  # perf_counter when scoring ended


@dataclass
class _Batch:
    """One batch on trl's loop: its scoring task and, once the reward functions arrive, the task
    that reports it (once) and the reward functions that took it."""

    scoring: asyncio.Future
    started: float
    prefetched: bool
    report: asyncio.Future | None = None
    taken_by: set[str] = field(default_factory=set)


class TrlRewardAdapter:
    def __init__(
        self,
        scorer: Scorer,
        examples: Mapping[str, Example],
        to_program: Callable[[str, str], str],
        components: Sequence[str],
        on_batch: Callable[[ScoredCompletions], None] | None = None,
        id_column: str = "example_id",
        max_prefetched: int = 2,
        max_failed_batches: int = 3,
    ):
        if TOTAL in components:
            raise ValueError(f"a reward component may not be called {TOTAL!r}: that name is the composed total")
        if max_prefetched < 1:
            raise ValueError(f"max_prefetched must be at least 1, got {max_prefetched}")
        self.scorer = scorer
        self.examples = examples
        self.to_program = to_program
        self.components = list(components)
        self.on_batch = on_batch
        self.id_column = id_column
        self.max_prefetched = max_prefetched
        # Batches in a row whose every program was our own failure (`infra_error`): trl gets None for
        # each, warns, and steps with a zero loss. On the first GPU run a tool failing on its device
        # did exactly that; past `max_failed_batches` the run stops and says why instead.
        self.max_failed_batches = max_failed_batches
        self._failed_in_a_row = 0
        self.timings: deque[BatchTiming] = deque(maxlen=1000)  # the latest batches, for benches and tests
        # Touched only from the loop the reward functions run on (trl's): no lock needed.
        self._batches: OrderedDict[tuple, _Batch] = OrderedDict()
        self._dropped: set[asyncio.Future] = set()  # dropped prefetches still running (kept referenced)
        # The functions the trainer was seen to use (None until a batch was released by the next one's
        # arrival): a script may pass only some of `reward_funcs`, so waiting for all would keep every batch.
        self._in_use: set[str] | None = None

    @property
    def reward_funcs(self) -> list[Callable[..., Any]]:
        funcs = [self._make(TOTAL, lambda s, i: s.rewards.totals[i])]
        for name in self.components:
            funcs.append(self._make(name, lambda s, i, name=name: _component(s, name, i)))
        return funcs

    @property
    def reward_weights(self) -> list[float]:
        return [1.0] + [0.0] * len(self.components)

    def prefetch(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        example_ids: Sequence[str],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Start scoring a batch now on `loop` (the loop the reward functions will run on: trl's
        `async_loop`), from another thread; returns once the task is registered, not when it ends.
        `prompts` and `completions` as trl will pass them to the reward functions."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("prefetch blocks until the loop registers the batch: call it from another thread")
        asyncio.run_coroutine_threadsafe(self._register(prompts, completions, example_ids), loop).result()

    async def _register(self, prompts: Sequence[Any], completions: Sequence[Any], example_ids: Sequence[str]) -> None:
        prompt_texts, texts, ids = [_text(p) for p in prompts], [_text(c) for c in completions], list(example_ids)
        key = _key(ids, prompt_texts, texts)
        if key in self._batches:  # the same content already scoring: one run serves both
            return
        task = asyncio.ensure_future(self._execute(prompt_texts, texts, ids))
        self._batches[key] = _Batch(task, time.perf_counter(), prefetched=True)
        waiting = [k for k, b in self._batches.items() if b.report is None]
        for old in waiting[: max(len(waiting) - self.max_prefetched, 0)]:
            self._drop(self._batches.pop(old).scoring)

    def _drop(self, task: asyncio.Future) -> None:
        """A prefetched batch nobody took: let it finish (cancelling could cancel executor runs a
        newer batch shares), keep it referenced until then, and say if it failed."""
        logger.warning("a prefetched batch was never taken by the reward functions; dropping it")
        self._dropped.add(task)
        task.add_done_callback(self._dropped_done)

    def _dropped_done(self, task: asyncio.Future) -> None:
        self._dropped.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("scoring a dropped prefetched batch failed: %r", task.exception())

    def _make(self, name: str, pick: Callable[[Scored, int], float | None]) -> Callable[..., Any]:
        async def reward(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float | None]:
            scored = await self._shared(name, prompts, completions, kwargs)
            return [pick(scored, i) for i in range(len(completions))]

        reward.__name__ = reward.__qualname__ = name
        return reward

    async def _shared(self, name: str, prompts: list[Any], completions: list[Any], kwargs: dict[str, Any]) -> Scored:
        # trl calls every reward function of one batch with the same prompts, completions and columns.
        if self.id_column not in kwargs:
            raise ValueError(f"the training dataset needs an {self.id_column!r} column naming each example")
        prompt_texts, texts, ids = (
            [_text(p) for p in prompts],
            [_text(c) for c in completions],
            list(kwargs[self.id_column]),
        )
        key = _key(ids, prompt_texts, texts)
        batch = self._batches.get(key)
        now = time.perf_counter()
        if batch is None:
            batch = _Batch(asyncio.ensure_future(self._execute(prompt_texts, texts, ids)), now, prefetched=False)
            self._batches[key] = batch
        if batch.report is None:  # the first reward function of this batch
            self._release_taken()
            batch.report = asyncio.ensure_future(self._report(batch, now, prompt_texts, texts, kwargs))
        batch.taken_by.add(name)
        if self._in_use is not None:
            self._in_use.add(name)
        if len(batch.taken_by) == len(self.reward_weights) or (
            self._in_use is not None and batch.taken_by >= self._in_use
        ):
            del self._batches[key]
        return await batch.report

    def _release_taken(self) -> None:
        """A new batch reached the reward functions, so the trainer is done with the batches they
        took before (trl asks for one batch's rewards at a time): release them, and learn from who
        took them which functions are in use, so that later batches go as soon as those took them."""
        for key in [k for k, b in self._batches.items() if b.report is not None]:
            taken = self._batches.pop(key).taken_by
            self._in_use = taken if self._in_use is None else self._in_use | taken

    async def _execute(self, prompt_texts: list[str], texts: list[str], ids: list[str]) -> _Executed:
        try:
            examples = [self.examples[i] for i in ids]
        except KeyError as exc:
            raise KeyError(f"example id {exc.args[0]!r} of the batch is not among the training examples") from None
        programs = [self.to_program(p, c) for p, c in zip(prompt_texts, texts, strict=True)]
        scored = await self.scorer.ascore(examples, programs)
        return _Executed(examples, programs, scored, time.perf_counter())

    async def _report(
        self, batch: _Batch, arrived: float, prompt_texts: list[str], texts: list[str], kwargs: dict[str, Any]
    ) -> Scored:
        done = await batch.scoring  # an exception while scoring (prefetched or not) surfaces here
        self._check_not_all_ours(done.scored.results)
        timing = BatchTiming(batch.prefetched, done.finished - batch.started, max(done.finished - arrived, 0.0))
        self.timings.append(timing)
        log_metric = kwargs.get("log_metric")
        if log_metric is not None:
            for key, value in self.batch_metrics(done.examples, done.programs, done.scored).items():
                log_metric(key, value)
            log_metric("timing/scoring_s", timing.scoring_s)
            log_metric("timing/scoring_hidden_s", timing.hidden_s)
        if self.on_batch is not None:
            state = kwargs.get("trainer_state")
            step = int(getattr(state, "global_step", 0) or 0)
            self.on_batch(ScoredCompletions(step, prompt_texts, texts, done.examples, done.programs, done.scored))
        return done.scored

    def _check_not_all_ours(self, results: Sequence[ExecutionResult]) -> None:
        if not results or any(r.status != "infra_error" for r in results):
            self._failed_in_a_row = 0
            return
        self._failed_in_a_row += 1
        if self._failed_in_a_row >= self.max_failed_batches:
            errors = Counter(r.error or "(no message)" for r in results).most_common(3)
            raise InfraFailure(
                f"every program of the last {self._failed_in_a_row} batches ended in infra_error (the executor's "
                f"or a tool's failure, not the policy's), so nothing was scored and no step learned; most "
                f"common: {errors}. `vprl run` runs programs through the same tool stack and sandbox and writes "
                f"each one's error; on a GPU, bench/gpu/acceptance.py checks every tool model on the device."
            )

    def batch_metrics(self, examples: Sequence[Example], programs: Sequence[str], scored: Scored) -> dict[str, float]:
        """Execution-status rates, reward-hacking diagnostics and the tool cache hit rate."""
        n = max(len(programs), 1)
        statuses = [r.status for r in scored.results]
        out = {f"exec/{s}": statuses.count(s) / n for s in STATUSES}
        diag = diagnostics(programs, [r.answer for r in scored.results])
        out["hacking/trivial_share"] = diag["trivial_share"]
        out["hacking/constant_answer_share"] = diag["constant_answer_share"]
        tools = self.scorer.metrics()
        if "cache_hit_rate" in tools:
            out["tools/cache_hit_rate"] = float(tools["cache_hit_rate"])
        return out


def _component(scored: Scored, name: str, i: int) -> float | None:
    """A component's value as logged: 0 for a program that failed to run (module docstring)."""
    value = scored.rewards.components[name][i]
    return 0.0 if value is None and scored.results[i].status in PROGRAM_FAILURES else value


def _text(value: Any) -> str:
    """A completion or prompt as text (conversational ones are lists of messages)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        return str(value[-1].get("content", ""))
    raise TypeError(f"expected text or a list of messages, got {type(value).__name__}")


def _key(ids: list[str], prompt_texts: list[str], texts: list[str]) -> tuple:
    """A batch by content: what the reward functions will see, whatever list objects carry it."""
    return (tuple(ids), tuple(prompt_texts), tuple(texts))
