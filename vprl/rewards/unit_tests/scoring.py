"""Scoring a program on its unit tests: per-test score h, aggregate H, and the reward modes.

    h(test) = 1                    the answer on the test image equals the expected answer
            = 0                    it answers something else
            = -compile_penalty     the program does not compile
            = -runtime_penalty     it fails while running (exception, timeout, limits)
            = None                 we failed to run it (infra_error): the test is left out

The papers give neither h's exact form nor the penalty values ([U] E.3; docs/references.md#unit-test-scoring);
these are ours, and
the penalties default to 0 so that the default reward is ViUniT's pass rate.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from vprl.executor.results import ExecutionResult
from vprl.rewards.answer_normalization import answer_to_text, normalize_answer

AGGREGATES = ("mean", "max", "min", "median", "majority")
MODES = ("pass_ratio", "all_pass", "threshold")
_NO_ANSWER = frozenset({"no answer", "none", "nothing", "unknown", ""})


@dataclass(frozen=True)
class ScoringConfig:
    aggregate: str = "mean"
    mode: str = "pass_ratio"
    threshold: float = 0.5  # for mode "threshold": reward 1 when the aggregate reaches it
    compile_penalty: float = 0.0
    runtime_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"unknown aggregate {self.aggregate!r}; valid: {AGGREGATES}")
        if self.mode not in MODES:
            raise ValueError(f"unknown unit-test reward mode {self.mode!r}; valid: {MODES}")


def answers_match(answer, expected: str) -> bool:
    got = answer_to_text(answer)
    got = normalize_answer(got) if got is not None else ""
    want = normalize_answer(expected)
    if want in _NO_ANSWER:
        return got in _NO_ANSWER
    return got == want


def unit_test_score(result: ExecutionResult, expected: str, config: ScoringConfig) -> float | None:
    if result.status == "infra_error":
        return None
    if result.status == "syntax_error":
        return -config.compile_penalty
    if result.status != "ok":
        return -config.runtime_penalty
    return 1.0 if answers_match(result.answer, expected) else 0.0


def aggregate(scores: Sequence[float], how: str) -> float:
    if how == "mean":
        return sum(scores) / len(scores)
    if how == "max":
        return max(scores)
    if how == "min":
        return min(scores)
    if how == "median":
        return float(statistics.median(scores))
    return 1.0 if sum(s > 0 for s in scores) * 2 > len(scores) else 0.0  # majority of tests passed


def program_score(results: Sequence[ExecutionResult], expected: Sequence[str], config: ScoringConfig) -> float | None:
    """H over the tests that ran; None when none could be run (all infra errors, or no tests)."""
    scores = [s for r, e in zip(results, expected, strict=True) if (s := unit_test_score(r, e, config)) is not None]
    if not scores:
        return None
    value = aggregate(scores, config.aggregate)
    if config.mode == "all_pass":
        return 1.0 if all(s == 1.0 for s in scores) else min(value, 0.0)
    if config.mode == "threshold":
        return 1.0 if value >= config.threshold else min(value, 0.0)
    return value
