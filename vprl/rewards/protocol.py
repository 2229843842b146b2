"""What a reward function is: `(examples, results, programs) -> list[float | None]`, one value per
result, `None` where it has nothing to say. It is only called for results whose execution
succeeded (`status == "ok"`); failures are scored by the composition's penalties, and
`infra_error` is never scored at all (see `vprl.rewards.compose`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from vprl.data.records import Example
from vprl.executor.results import ExecutionResult


class RewardFn(Protocol):
    def __call__(
        self, examples: Sequence[Example], results: Sequence[ExecutionResult], programs: Sequence[str]
    ) -> list[float | None]: ...


# Builds a reward function from keyword settings (from the YAML recipe) and the live resources it names.
RewardFactory = Callable[..., RewardFn]
