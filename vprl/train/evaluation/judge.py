"""Unit tests as a judge at inference time: ViUniT's best-program selection and re-prompting.

It wraps the "unit_tests" reward (the same writer, image generator, caches and scoring as in RL),
keeping each program's report so that re-prompting can show the model which tests it failed:
`feedback` as one line (ViUniT's re-prompt of `reprompt_tests`), `reports` as outcome rows
(`TestOutcome`, ViUniT's structure, which the `repair` mode's feedback shows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vprl.data.records import Example
from vprl.rewards.registry import build_reward
from vprl.rewards.unit_tests.reward import ProgramReport, UnitTestReward

MAX_FEEDBACK_TESTS = 3  # failed tests shown in a re-prompt; more makes the prompt long for little gain


class UnitTestJudge:
    def __init__(self, reward: UnitTestReward):
        self.reward = reward
        self._reports: dict[tuple[str, str], ProgramReport] = {}

    def reports(self, examples: Sequence[Example], programs: Sequence[str]) -> list[ProgramReport]:
        """Each program's report (its score and every test's outcome), kept for `feedback`. Only the
        query is read from an example, never its answers."""
        reports = self.reward.evaluate([e.query for e in examples], list(programs))
        for e, p, r in zip(examples, programs, reports):
            self._reports[(e.query, p)] = r
        return reports

    def scores(self, examples: Sequence[Example], programs: Sequence[str]) -> list[float | None]:
        return [r.value for r in self.reports(examples, programs)]

    def feedback(self, example: Example, program: str) -> str:
        report = self._reports.get((example.query, program))
        if report is None:
            (report,) = self.reward.evaluate([example.query], [program])
        return failed_tests_line([o.to_json() for o in report.outcomes])


def failed_tests_line(outcomes: Sequence[Mapping[str, Any]]) -> str:
    """The failed tests among outcome rows (`TestOutcome.to_json()`) in one line: what the program
    answered on which test image, against what was expected."""
    failed = [o for o in outcomes if o.get("score") is None or float(o["score"]) < 1.0]
    if not failed:
        return "no failed test"
    shown = []
    for o in failed[:MAX_FEEDBACK_TESTS]:
        got = o.get("answer") if o.get("status") == "ok" else str(o.get("status", "")).replace("_", " ")
        shown.append(f'on an image of "{o.get("caption")}" it answered {got!r}, expected {o.get("expected")!r}')
    return "; ".join(shown)


def build_judge(settings: dict[str, Any], runner: Any) -> UnitTestJudge:
    reward = build_reward("unit_tests", {"runner": runner}, **settings)
    return UnitTestJudge(reward)
