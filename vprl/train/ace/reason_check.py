"""Right for the right reason: ACE candidates checked on visual unit tests before they are picked.

A program that earned the correctness reward may have answered right by accident (an answer to "...
and a cyan circle?" computed from `exists("purple circle")`). In-context examples teach the policy
whatever they show, so such programs must not become ACEs. Each candidate runs on the visual unit
tests of its query (the `unit_tests` reward: the same writer, images, caches and scoring as in RL and
evaluation); one scoring below `min_score` is right for the wrong reason, the evaluation's
`right_for_wrong_reason` rate, and is dropped.

Which tests: `--unit_tests auto` takes the run's own `unit_tests` reward settings when it trained with
one, the reward's defaults (the shapes world's rule-based writer) on a shapes-world run, and nothing
otherwise (the command says so: an LLM writer is a model to load, so it is asked for by name).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vprl.train.ace.records import Ace, AceError

MIN_SCORE = 0.5  # the evaluation's `unit_test_pass`: below it a right answer counts as right for the wrong reason


@dataclass(frozen=True)
class ReasonCheck:
    """The unit-test reward's settings and the pass mark; `settings` None: no check."""

    settings: dict[str, Any] | None = None
    min_score: float = MIN_SCORE
    origin: str = ""  # where the settings came from, for the report
    notes: list[str] = field(default_factory=list)


def reason_check(asked: str, manifest: dict[str, Any], min_score: float = MIN_SCORE) -> ReasonCheck:
    """`asked`: "auto", "none", or a JSON mapping of `unit_tests` reward settings."""
    if not 0.0 <= min_score <= 1.0:
        raise AceError(f"--min_unit_test_score must be in [0, 1], got {min_score}")
    if asked == "none":
        return ReasonCheck(
            None, min_score, "off", ["unit-test check off (--unit_tests none): ACEs may be right by accident"]
        )
    if asked != "auto":
        try:
            settings = json.loads(asked)
        except json.JSONDecodeError as exc:
            raise AceError(f"--unit_tests: not auto, none or a JSON mapping ({exc})") from None
        if not isinstance(settings, dict):
            raise AceError(f"--unit_tests: expected a JSON mapping of unit_tests settings, got {asked!r}")
        return ReasonCheck(settings, min_score, "--unit_tests")
    for spec in (manifest.get("rewards") or {}).get("rewards", []):
        if spec.get("name") == "unit_tests":
            return ReasonCheck(dict(spec.get("settings") or {}), min_score, "the run's unit_tests reward")
    if (manifest.get("dataset") or {}).get("dataset") == "shapes":
        # balanced: a constant answer passes about 1/answers of the tests (coverage lets "no" pass most)
        return ReasonCheck({"sampler": "balanced"}, min_score, "the shapes world's rule-based test writer")
    return ReasonCheck(
        None,
        min_score,
        "off",
        [
            "no unit-test check: the run trained without a unit_tests reward and is not on the shapes world; pass "
            '--unit_tests \'{"writer": "llm", ...}\' to check the candidates (ACEs may be right by accident)'
        ],
    )


def unit_test_scores(manifest: dict[str, Any], settings: dict[str, Any], aces: Sequence[Ace]) -> list[float | None]:
    """Each candidate's pass rate on its query's unit tests, run in the run's tool stack and sandbox."""
    from vprl.executor.backends import open_backend
    from vprl.executor.host import ToolHost
    from vprl.executor.runner import RunnerConfig, SyncRunner
    from vprl.rewards.registry import build_reward

    stack = (manifest.get("tool_stack") or {}).get("config")
    if not stack:
        raise AceError(
            "the run's manifest names no tool stack; the unit tests cannot run (--unit_tests none skips them)"
        )
    executor = manifest.get("executor") or {}
    runner_cfg = RunnerConfig(
        **{k: executor[k] for k in ("slots", "timeout_s", "sandbox") if executor.get(k) is not None}
    )
    with SyncRunner(ToolHost(open_backend(stack)), runner_cfg) as runner:
        reward = build_reward("unit_tests", {"runner": runner}, **settings)
        reports = reward.evaluate([a.query for a in aces], [a.program for a in aces])
    return [r.value for r in reports]


def keep_right_for_right_reason(
    aces: list[Ace], check: ReasonCheck, manifest: dict[str, Any], counts: dict[str, int]
) -> tuple[list[Ace], list[str]]:
    """The candidates that pass their unit tests (or could not be tested), and notes for the report;
    counts gain `checked`, `rejected_wrong_reason` and `untested`."""
    if check.settings is None or not aces:
        return aces, list(check.notes)
    scores = unit_test_scores(manifest, check.settings, aces)
    kept = [a for a, s in zip(aces, scores, strict=True) if s is None or s >= check.min_score]
    counts["checked"] = len(aces)
    counts["rejected_wrong_reason"] = sum(s is not None and s < check.min_score for s in scores)
    counts["untested"] = sum(s is None for s in scores)
    notes = [
        f"unit-test check ({check.origin}): rejected {counts['rejected_wrong_reason']} of {len(aces)} candidates that "
        f"were right but scored below {check.min_score:g} on their visual unit tests (right for the wrong reason)"
        + (f"; {counts['untested']} had no test and were kept" if counts["untested"] else "")
    ]
    return kept, list(check.notes) + notes
