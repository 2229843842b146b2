"""The composed reward as trl's `reward_funcs`: one executor run per completion batch, shared.

trl calls every reward function with the batch's prompts, completions and dataset columns, and
sums `reward_weights[i] * reward_i`. `TrlRewardAdapter.reward_funcs` gives:

- `total` (weight 1): the composer's total: the weighted components for a program that ran, the
  status penalty for one that failed, None for `infra_error`. Every function returns None there,
  so trl counts the completion as unscorable: out of the group baseline, advantage 0.
- one function per component (weight 0): the component's value (None where it had nothing to
  say), so trl logs `rewards/<name>/mean` and shows it in the completions table without it
  entering the advantage twice.

All of them are async (trl gathers async reward functions on its own event loop): the first to
start runs the batch through the scorer (sandboxed execution on the executor's loop, composition
in a worker thread) and the others await the same result, so each batch executes once.

Layering: rewards never imports train; the caller hands in `to_program` (completion -> program
source) and a scorer with `async ascore(examples, programs)` returning `.results` and `.rewards`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from data.records import Example
from executor.results import STATUSES, ExecutionResult
from rewards.compose import RewardBatch
from rewards.diagnostics import diagnostics

TOTAL = "total"


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


class TrlRewardAdapter:
    def __init__(
        self,
        scorer: Scorer,
        examples: Mapping[str, Example],
        to_program: Callable[[str, str], str],
        components: Sequence[str],
        on_batch: Callable[[ScoredCompletions], None] | None = None,
        id_column: str = "example_id",
    ):
        if TOTAL in components:
            raise ValueError(f"a reward component may not be called {TOTAL!r}: that name is the composed total")
        self.scorer = scorer
        self.examples = examples
        self.to_program = to_program
        self.components = list(components)
        self.on_batch = on_batch
        self.id_column = id_column
        self._pending: dict[int, list[Any]] = {}  # id(completions) -> [task, consumers left]

    @property
    def reward_funcs(self) -> list[Callable[..., Any]]:
        funcs = [self._make(TOTAL, lambda s, i: s.rewards.totals[i])]
        for name in self.components:
            funcs.append(self._make(name, lambda s, i, name=name: s.rewards.components[name][i]))
        return funcs

    @property
    def reward_weights(self) -> list[float]:
        return [1.0] + [0.0] * len(self.components)

    def _make(self, name: str, pick: Callable[[Scored, int], float | None]) -> Callable[..., Any]:
        async def reward(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float | None]:
            scored = await self._shared(prompts, completions, kwargs)
            return [pick(scored, i) for i in range(len(completions))]

        reward.__name__ = reward.__qualname__ = name
        return reward

    async def _shared(self, prompts: list[str], completions: list[str], kwargs: dict[str, Any]) -> Scored:
        # trl passes the same `completions` list to every reward function of one batch.
        key = id(completions)
        entry = self._pending.get(key)
        if entry is None:
            entry = [asyncio.ensure_future(self._score(prompts, completions, kwargs)), 1 + len(self.components)]
            self._pending[key] = entry
        entry[1] -= 1
        if entry[1] == 0:
            del self._pending[key]
        return await entry[0]

    async def _score(self, prompts: list[str], completions: list[str], kwargs: dict[str, Any]) -> Scored:
        if self.id_column not in kwargs:
            raise ValueError(f"the training dataset needs an {self.id_column!r} column naming each example")
        texts = [_text(c) for c in completions]
        prompt_texts = [_text(p) for p in prompts]
        try:
            examples = [self.examples[i] for i in kwargs[self.id_column]]
        except KeyError as exc:
            raise KeyError(f"example id {exc.args[0]!r} of the batch is not among the training examples") from None
        programs = [self.to_program(p, c) for p, c in zip(prompt_texts, texts, strict=True)]
        scored = await self.scorer.ascore(examples, programs)
        log_metric = kwargs.get("log_metric")
        if log_metric is not None:
            for key, value in self.batch_metrics(examples, programs, scored).items():
                log_metric(key, value)
        if self.on_batch is not None:
            state = kwargs.get("trainer_state")
            step = int(getattr(state, "global_step", 0) or 0)
            self.on_batch(ScoredCompletions(step, prompt_texts, texts, examples, programs, scored))
        return scored

    def batch_metrics(self, examples: Sequence[Example], programs: Sequence[str], scored: Scored) -> dict[str, float]:
        """Execution-status rates, reward-hacking diagnostics and the tool cache hit rate."""
        n = max(len(programs), 1)
        statuses = [r.status for r in scored.results]
        out = {f"exec/{s}": statuses.count(s) / n for s in STATUSES}
        groups = [e.id for e in examples]
        diag = diagnostics(programs, [r.answer for r in scored.results], scored.rewards.totals, groups)
        out["hacking/trivial_share"] = diag["trivial_share"]
        out["hacking/constant_answer_share"] = diag["constant_answer_share"]
        tools = self.scorer.metrics()
        if "cache_hit_rate" in tools:
            out["tools/cache_hit_rate"] = float(tools["cache_hit_rate"])
        return out


def _text(value: Any) -> str:
    """A completion or prompt as text (conversational ones are lists of messages)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        return str(value[-1].get("content", ""))
    raise TypeError(f"expected text or a list of messages, got {type(value).__name__}")
