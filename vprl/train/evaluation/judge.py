"""Unit tests as a judge at inference time: ViUniT's best-program selection and re-prompting.

It wraps the "unit_tests" reward (the same writer, image generator, caches and scoring as in RL),
keeping each program's report so that re-prompting can show the model which tests it failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vprl.data.records import Example
from vprl.rewards.registry import build_reward
from vprl.rewards.unit_tests.reward import ProgramReport, UnitTestReward

MAX_FEEDBACK_TESTS = 3  # failed tests shown in a re-prompt; more makes the prompt long for little gain


class UnitTestJudge:
    def __init__(self, reward: UnitTestReward):
        self.reward = reward
        self._reports: dict[tuple[str, str], ProgramReport] = {}

    def scores(self, examples: Sequence[Example], programs: Sequence[str]) -> list[float | None]:
        reports = self.reward.evaluate([e.query for e in examples], list(programs))
        for e, p, r in zip(examples, programs, reports):
            self._reports[(e.query, p)] = r
        return [r.value for r in reports]

    def feedback(self, example: Example, program: str) -> str:
        report = self._reports.get((example.query, program))
        if report is None:
            (report,) = self.reward.evaluate([example.query], [program])
        failed = [o for o in report.outcomes if o.score is None or o.score < 1.0]
        if not failed:
            return "no failed test"
        shown = []
        for o in failed[:MAX_FEEDBACK_TESTS]:
            got = o.answer if o.status == "ok" else o.status.replace("_", " ")
            shown.append(f'on an image of "{o.caption}" it answered {got!r}, expected {o.expected!r}')
        return "; ".join(shown)


def build_judge(settings: dict[str, Any], runner: Any) -> UnitTestJudge:
    reward = build_reward("unit_tests", {"runner": runner}, **settings)
    return UnitTestJudge(reward)
