"""What every inference mode shares: the mode's settings (`ModeConfig`), what a mode is given
(`EvalContext`, with the unit-test judge's protocol), and the steps the modes are built of: generate
programs, run them (an answer of the wrong kind is no answer), turn a run into a prediction.
`vprl.train.evaluation.modes` holds the modes themselves; `repair_mode` the episode-based ones."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from vprl.data.records import Example
from vprl.executor.results import ExecutionResult
from vprl.executor.runner import SyncRunner
from vprl.rewards.correctness import answer_kind_error
from vprl.rewards.feedback import PARTS, STOP_RULES
from vprl.train.evaluation.metrics import Prediction
from vprl.train.prompts import PreviousAttempt, completion_to_program
from vprl.train.sampling.generator import Generator, SamplingSettings

MODES = ("single", "majority", "unit_test_select", "reprompt_tests", "self_debug", "self_tuning", "repair")
FEEDBACK = ("error", "scratch")
KEEP = ("final", "best")
LATER_TURNS = ("greedy", "sampled")
# What the evaluation's feedback may show: never `verdict`, which is read from a label.
EVAL_PARTS = tuple(p for p in PARTS if p != "verdict")


@dataclass(frozen=True)
class ModeConfig:
    name: str = "single"
    n_programs: int = 8  # majority, unit_test_select
    iterations: int = 2  # reprompt_tests, self_debug: rounds of regeneration
    feedback: str = "error"  # self_debug: "error" feeds the error back, "scratch" resamples the prompt
    refuse_below: float | None = None  # unit_test_select: refuse when the best unit-test score is below
    pass_threshold: float = 1.0  # reprompt_tests: a program below this unit-test score is re-prompted
    fallback: bool = False
    # With the fallback: also answer by it when unsure, i.e. the program's unit-test score is below
    # this or its answer was refused (ViUniT's fallback on low scores; the judge scores single programs)
    fallback_below: float | None = None
    # repair: programs per question at most, when an episode ends, what its feedback shows, and
    # which program answers (the final one, or the best by unit tests, which needs the judge)
    turns: int = 2
    stop_when: str = "ran"
    show: tuple[str, ...] = ("error", "trace", "unit_tests")
    keep: str = "final"
    # how programs after the first are written: greedy, or sampled at the mode's temperature as a
    # repair run's training episodes are (a greedy decode after RL often repeats the first program)
    later_turns: str = "greedy"

    def __post_init__(self) -> None:
        if self.name not in MODES:
            raise ValueError(f"inference mode {self.name!r} is not one of {MODES}")
        if self.feedback not in FEEDBACK:
            raise ValueError(f"mode {self.name}: feedback {self.feedback!r} is not one of {FEEDBACK}")
        if self.n_programs < 1 or self.iterations < 0:
            raise ValueError(f"mode {self.name}: n_programs must be >= 1 and iterations >= 0")
        if self.fallback_below is not None and not self.fallback:
            raise ValueError(f"mode {self.name}: fallback_below needs fallback on")
        object.__setattr__(self, "show", tuple(self.show))
        if self.turns < 1:
            raise ValueError(f"mode {self.name}: turns must be >= 1, got {self.turns}")
        if self.stop_when not in STOP_RULES:
            raise ValueError(f"mode {self.name}: stop_when {self.stop_when!r} is not one of {STOP_RULES}")
        if "verdict" in self.show:
            raise ValueError(
                f"mode {self.name}: show 'verdict' is refused in an evaluation: it is read from the label, "
                f"and the evaluation never feeds labels back; choose among {EVAL_PARTS}"
            )
        unknown = [p for p in self.show if p not in EVAL_PARTS]
        if unknown:
            raise ValueError(f"mode {self.name}: show {unknown} are not among {EVAL_PARTS}")
        if self.keep not in KEEP:
            raise ValueError(f"mode {self.name}: keep {self.keep!r} is not one of {KEEP}")
        if self.later_turns not in LATER_TURNS:
            raise ValueError(f"mode {self.name}: later_turns {self.later_turns!r} is not one of {LATER_TURNS}")

    @property
    def needs_judge(self) -> bool:
        """Whether the mode scores programs on unit tests (the judge, `unit_tests` settings)."""
        if self.name == "repair":
            return self.stop_when == "passed" or self.keep == "best"
        return self.name in ("unit_test_select", "reprompt_tests")

    @property
    def label(self) -> str:
        """The mode's row in reports, in words: the mode and the settings that change which program
        answers. `fallback_below` is not in it: the program-alone row does not depend on it, and
        the "+fallback" row's glossary entry (`fallback_description`) says what it changes there."""
        n, rounds = self.n_programs, f"{self.iterations} round{'' if self.iterations == 1 else 's'}"
        words = {
            "single": "single",
            "majority": f"majority of {n}",
            "unit_test_select": f"best of {n} by unit tests",
            "reprompt_tests": f"re-prompted on unit tests, {rounds}",
            "self_debug": f"self-debugging {'with the error' if self.feedback == 'error' else 'from scratch'}, {rounds}",
            "self_tuning": "self-tuning",
            "repair": f"repair, up to {self.turns} program{'' if self.turns == 1 else 's'} "
            + ("until one runs" if self.stop_when == "ran" else f"until unit tests reach {self.pass_threshold:g}")
            + (", best by unit tests" if self.keep == "best" else "")
            + (", later ones sampled" if self.later_turns == "sampled" else ""),
        }[self.name]
        if self.refuse_below is not None:
            words += f", refusing below {self.refuse_below:g}"
        return words

    @property
    def description(self) -> str:
        """What the label's row did, for the report's glossary."""
        n = self.n_programs
        text = {
            "single": "one greedy program per question",
            "majority": f"{n} sampled programs, the answer most of those that ran gave",
            "unit_test_select": f"{n} sampled programs, the one passing most of its visual unit tests answers "
            "(ViUniT's selection)",
            "reprompt_tests": f"a program failing its unit tests (below {self.pass_threshold:g}) is shown to the "
            f"policy again with what it answered on which test image, up to {self.iterations} times (ViUniT)",
            "self_debug": f"a program that fails to run is written again, up to {self.iterations} times, "
            + ("with its error in the prompt" if self.feedback == "error" else "from a fresh sample")
            + " (Stanić et al.'s self-debugging)",
            "self_tuning": "a program that fails or finds nothing runs again with lowered detection thresholds "
            "(Stanić et al.'s self-tuning)",
            "repair": "a program that "
            + (
                "fails to run"
                if self.stop_when == "ran"
                else f"fails to run or scores below {self.pass_threshold:g} on its visual unit tests"
            )
            + f" gets feedback ({', '.join(self.show) or 'that it did not pass'}) in the repair conversation and "
            f"is written again ({'sampled' if self.later_turns == 'sampled' else 'greedy'}), up to {self.turns} "
            "programs per question; "
            + ("the best by unit tests answers" if self.keep == "best" else "the last one answers")
            + " (learned repair; no label is ever shown)",
        }[self.name]
        if self.refuse_below is not None:
            text += f"; the answer is refused (counts as wrong) when even the best scores below {self.refuse_below:g}"
        return text + "; the programs alone, no fallback"

    @property
    def fallback_description(self) -> str:
        """What the "+fallback" row of this mode did, for the report's glossary."""
        when = "failed to run (an exception, a timeout or an answer of the wrong kind)"
        if self.fallback_below is not None:
            when += (
                f", was refused, or scored below {self.fallback_below:g} on its visual unit tests (by default the "
                "share of them it passes)"
            )
        return (
            f"the same programs ({self.label}), with the end-to-end tool's answer wherever the program {when}: "
            "simple_query for a question, the detector's first box for a referring expression, the better "
            "matching of the caption and its pair's other one for image-text matching (vprl/train/evaluation/fallback.py)"
        )


class UnitTestJudge(Protocol):
    """Scores programs on unit tests written for their queries (no labels)."""

    def scores(self, examples: Sequence[Example], programs: Sequence[str]) -> list[float | None]: ...

    def reports(self, examples: Sequence[Example], programs: Sequence[str]) -> list[Any]:
        """Each program's `ProgramReport`: its score (`value`) and its tests' `outcomes`."""
        ...

    def feedback(self, example: Example, program: str) -> str:
        """What the program answered on which test image, against what was expected."""
        ...


@dataclass
class EvalContext:
    """What a mode needs. `prompt(example, previous)` builds the (unframed) prompt for an example."""

    generator: Generator
    prompt: Callable[[Example, PreviousAttempt | None], str]
    runner: SyncRunner
    greedy: SamplingSettings
    sampling: SamplingSettings
    judge: UnitTestJudge | None = None
    tuned_runner: SyncRunner | None = None
    fallback_program: Callable[[Example], str] | None = None


def _generate(
    ctx: EvalContext,
    examples: Sequence[Example],
    n: int,
    sampling: SamplingSettings,
    previous: Sequence[PreviousAttempt | None] | None = None,
) -> list[list[str]]:
    prompts = [ctx.prompt(e, previous[i] if previous else None) for i, e in enumerate(examples)]
    completions = ctx.generator.generate(prompts, dataclasses.replace(sampling, n=n))
    return [[completion_to_program(p, c) for c in cs] for p, cs in zip(prompts, completions)]


def _run(ctx: EvalContext, examples: Sequence[Example], programs: Sequence[str], runner=None) -> list[ExecutionResult]:
    results = (runner or ctx.runner).run(list(zip(examples, programs)))
    return [_checked_kind(e, r) for e, r in zip(examples, results)]


def _checked_kind(example: Example, result: ExecutionResult) -> ExecutionResult:
    """An answer of the wrong kind for the task (a grounding program returning "yes") is no answer:
    a bad_return, so it counts as an exception and the fallback may answer it."""
    if result.status != "ok":
        return result
    why = answer_kind_error(example.task, result.answer)
    return result if why is None else dataclasses.replace(result, status="bad_return", answer=None, error=why)


def _prediction(example: Example, program: str, result: ExecutionResult, **extra: Any) -> Prediction:
    return Prediction(
        example_id=example.id,
        answer=result.answer if result.status == "ok" else None,
        status=result.status,
        program=program,
        error=result.error,
        tool_calls=[c.to_json() for c in result.tool_calls],
        **extra,
    )


def _need_judge(ctx: EvalContext, what: str) -> UnitTestJudge:
    if ctx.judge is None:
        raise ValueError(f"{what} needs unit tests: configure `unit_tests` in the evaluation config")
    return ctx.judge
