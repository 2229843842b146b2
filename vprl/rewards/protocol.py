"""What a reward function is: `(examples, results, programs) -> list[float | None]`, one value per
result, `None` where it has nothing to say. It is only called for results whose execution
succeeded (`status == "ok"`); failures are scored by the composition's penalties, and
`infra_error` is never scored at all (see `vprl.rewards.compose`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from vprl.data.records import Example
from vprl.executor.results import ExecutionResult


class RewardFn(Protocol):
    def __call__(
        self, examples: Sequence[Example], results: Sequence[ExecutionResult], programs: Sequence[str]
    ) -> list[float | None]: ...


class DetailedRewardFn(RewardFn, Protocol):
    """A reward that can also show its evidence: `detailed` returns the values `__call__` would and,
    per result, a short list of JSON rows (the unit-test reward: each test's outcome). The composer
    calls it instead of `__call__` and keeps the rows in `RewardBatch.details` under the reward's
    name; the rollout rows carry them to the run viewer. Only rewards whose evidence is worth a
    place in every row implement it."""

    def detailed(
        self, examples: Sequence[Example], results: Sequence[ExecutionResult], programs: Sequence[str]
    ) -> tuple[list[float | None], list[list[dict[str, Any]]]]: ...


# Builds a reward function from keyword settings (from the YAML recipe) and the live resources it names.
RewardFactory = Callable[..., RewardFn]
