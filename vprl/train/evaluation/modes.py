"""The papers' inference-time uses of programs and unit tests, one function per mode
(docs/references.md#evaluation-modes).

- `single`: one greedy program (ViperGPT, Stanić et al.'s zero-shot row).
- `majority`: N sampled programs, majority vote over the answers of those that ran.
- `unit_test_select`: ViUniT's best-program selection — N programs, each scored on k unit tests,
  the best-scoring one answers; with `refuse_below`, the answer is refused when even the best
  program scores below it (ViUniT's answer refusal; a query no test could be written for is
  answered, since there is no evidence against it).
- `reprompt_tests`: ViUniT's re-prompting — a program that fails its unit tests is shown to the
  model again with what it answered on which test image, for `iterations` rounds.
- `self_debug`: Stanić et al.'s self-debugging — a program that fails to execute is regenerated,
  either from scratch (`feedback: scratch`, a fresh sample of the same prompt) or with its error
  fed back (`feedback: error`: re-prompting with the error message), for `iterations` rounds.
- `repair`: learned repair (docs/repair.md), the mode a policy trained on repair episodes is
  evaluated in — a program that fails to run (`stop_when: ran`) or, with the judge, scores below
  `pass_threshold` on its unit tests (`stop_when: passed`) gets a feedback message in the
  conversation format the policy was trained on (`vprl/train/prompts/conversation.py`), and the
  policy writes it again, up to `turns` programs per question. The feedback shows the error, the
  trace and the failed unit tests (`show`), never a label (`verdict` is refused here).
  `self_debug` and `reprompt_tests` are its untrained special cases, run by the same episode loop
  (`vprl/train/evaluation/repair_mode.py`) with the papers' re-prompt instead of the conversation.
- `self_tuning`: Stanić et al.'s self-tuning — a program that fails or finds nothing is run again
  on a tool stack with lowered detection thresholds (the tuned runner).
- `fallback` (any mode): a program that fails to execute is answered by the end-to-end tool
  instead (BLIP-2 `simple_query` for VQA, CLIP matching for image-text matching); reported
  separately, never mixed into the no-fallback numbers. With `fallback_below`, the fallback also
  answers when the program is unsure: its answer was refused or its unit-test score is below the
  threshold (ours: ViUniT's refusal rule with the fallback's answer in place of none;
  docs/references.md#execution-and-errors; single programs are scored by the judge for it).

Every mode works on a whole dataset at once so generation and execution run in large batches.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from vprl.data.records import Example
from vprl.executor.results import ExecutionResult
from vprl.executor.runner import SyncRunner
from vprl.rewards.answer_normalization import answer_to_text, normalize_answer
from vprl.rewards.correctness import answer_kind_error
from vprl.rewards.feedback import PARTS, STOP_RULES
from vprl.train.evaluation.metrics import Prediction
from vprl.train.prompts import PreviousAttempt, completion_to_program
from vprl.train.sampling.generator import Generator, SamplingSettings

MODES = ("single", "majority", "unit_test_select", "reprompt_tests", "self_debug", "self_tuning", "repair")
FEEDBACK = ("error", "scratch")
KEEP = ("final", "best")
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
            + (", best by unit tests" if self.keep == "best" else ""),
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
            f"is written again, up to {self.turns} programs per question; "
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


def answer_key(answer: Any) -> str | None:
    """What majority voting compares: normalised answer text, or a box rounded to 8 px."""
    if isinstance(answer, dict) and isinstance(answer.get("box"), list):
        return "box:" + ",".join(str(round(float(v) / 8)) for v in answer["box"])
    text = answer_to_text(answer)
    return normalize_answer(text) if text is not None else None


def single(ctx: EvalContext, examples: Sequence[Example], cfg: ModeConfig) -> list[Prediction]:
    programs = [ps[0] for ps in _generate(ctx, examples, 1, ctx.greedy)]
    results = _run(ctx, examples, programs)
    return [_prediction(e, p, r) for e, p, r in zip(examples, programs, results)]


def _candidates(ctx: EvalContext, examples: Sequence[Example], n: int):
    groups = _generate(ctx, examples, n, ctx.sampling)
    flat_ex = [e for e, ps in zip(examples, groups) for _ in ps]
    flat_pr = [p for ps in groups for p in ps]
    flat_res = _run(ctx, flat_ex, flat_pr)
    out, i = [], 0
    for ps in groups:
        out.append(list(zip(ps, flat_res[i : i + len(ps)])))
        i += len(ps)
    return out, flat_ex, flat_pr


def majority(ctx: EvalContext, examples: Sequence[Example], cfg: ModeConfig) -> list[Prediction]:
    groups, _, _ = _candidates(ctx, examples, cfg.n_programs)
    preds = []
    for e, cands in zip(examples, groups):
        votes = Counter(k for _, r in cands if r.status == "ok" and (k := answer_key(r.answer)) is not None)
        if votes:
            top = votes.most_common(1)[0][0]
            program, result = next((p, r) for p, r in cands if r.status == "ok" and answer_key(r.answer) == top)
        else:
            program, result = cands[0]
        preds.append(_prediction(e, program, result, attempts=len(cands)))
    return preds


def unit_test_select(ctx: EvalContext, examples: Sequence[Example], cfg: ModeConfig) -> list[Prediction]:
    judge = _need_judge(ctx, f"mode {cfg.name}")
    groups, flat_ex, flat_pr = _candidates(ctx, examples, cfg.n_programs)
    flat_scores = judge.scores(flat_ex, flat_pr)
    preds, i = [], 0
    for e, cands in zip(examples, groups):
        scores = flat_scores[i : i + len(cands)]
        i += len(cands)
        # Failed programs never win over ones that ran; among equals the earliest sample wins.
        ranked = sorted(
            range(len(cands)),
            key=lambda j: (cands[j][1].status == "ok", scores[j] if scores[j] is not None else -1.0),
            reverse=True,
        )
        best = ranked[0]
        program, result = cands[best]
        score = scores[best]
        # No test could be run (the writer knows no template for the query): no evidence to refuse on.
        refused = cfg.refuse_below is not None and score is not None and score < cfg.refuse_below
        preds.append(_prediction(e, program, result, unit_test_score=score, refused=refused, attempts=len(cands)))
    return preds


def reprompt_tests(ctx: EvalContext, examples: Sequence[Example], cfg: ModeConfig) -> list[Prediction]:
    """ViUniT's re-prompting: the repair loop's untrained case, stopping at a pass on the unit tests,
    with the failed tests in the papers' re-prompt, and keeping the better-scoring program."""
    from vprl.train.evaluation.repair_mode import run_episodes

    return run_episodes(ctx, examples, cfg)


def self_debug(ctx: EvalContext, examples: Sequence[Example], cfg: ModeConfig) -> list[Prediction]:
    """Stanić et al.'s self-debugging: the repair loop's untrained case, stopping at the first program
    that runs, with its error in the papers' re-prompt (or, from scratch, a fresh sample)."""
    from vprl.train.evaluation.repair_mode import run_episodes

    return run_episodes(ctx, examples, cfg)


def repair(ctx: EvalContext, examples: Sequence[Example], cfg: ModeConfig) -> list[Prediction]:
    """Learned repair: feedback in the conversation the policy was trained on, K turns at most."""
    from vprl.train.evaluation.repair_mode import run_episodes

    return run_episodes(ctx, examples, cfg)


def _found_nothing(result: ExecutionResult) -> bool:
    return result.status != "ok" or result.answer is None or result.answer in ("", [], {})


def self_tuning(ctx: EvalContext, examples: Sequence[Example], cfg: ModeConfig) -> list[Prediction]:
    if ctx.tuned_runner is None:
        raise ValueError("mode self_tuning needs a tuned tool stack (EvalConfig.self_tuning overrides)")
    programs = [ps[0] for ps in _generate(ctx, examples, 1, ctx.greedy)]
    results = _run(ctx, examples, programs)
    todo = [i for i, r in enumerate(results) if _found_nothing(r) and r.status != "infra_error"]
    attempts = [1] * len(examples)
    if todo:
        retried = _run(ctx, [examples[i] for i in todo], [programs[i] for i in todo], runner=ctx.tuned_runner)
        for i, result in zip(todo, retried):
            attempts[i] = 2
            results[i] = result
    return [_prediction(e, p, r, attempts=a) for e, p, r, a in zip(examples, programs, results, attempts)]


def _need_judge(ctx: EvalContext, what: str) -> UnitTestJudge:
    if ctx.judge is None:
        raise ValueError(f"{what} needs unit tests: configure `unit_tests` in the evaluation config")
    return ctx.judge


RUNNERS = {
    "single": single,
    "majority": majority,
    "unit_test_select": unit_test_select,
    "reprompt_tests": reprompt_tests,
    "self_debug": self_debug,
    "self_tuning": self_tuning,
    "repair": repair,
}


def with_fallback(
    ctx: EvalContext, examples: Sequence[Example], preds: list[Prediction], below: float | None = None
) -> list[Prediction]:
    """Attach the end-to-end tool's answer to every prediction whose program failed to execute and,
    with `below`, to every refused one and every one whose unit-test score is below it (scored by
    the judge when the mode did not score it; a query without tests has no score and keeps its
    program's answer)."""
    if ctx.fallback_program is None:
        raise ValueError("fallback is on but no fallback program is configured")
    preds = list(preds)
    if below is not None:
        unscored = [i for i, p in enumerate(preds) if p.status == "ok" and not p.refused and p.unit_test_score is None]
        if unscored:
            scores = _need_judge(ctx, "fallback_below").scores(
                [examples[i] for i in unscored], [preds[i].program for i in unscored]
            )
            for i, score in zip(unscored, scores):
                preds[i] = dataclasses.replace(preds[i], unit_test_score=score)
    chosen = [
        i
        for i, p in enumerate(preds)
        if (p.status not in ("ok", "infra_error") and not p.refused)
        or (below is not None and (p.refused or (p.unit_test_score is not None and p.unit_test_score < below)))
    ]
    if not chosen:
        return preds
    sub = [examples[i] for i in chosen]
    results = _run(ctx, sub, [ctx.fallback_program(e) for e in sub])
    for i, r in zip(chosen, results):
        if r.status == "ok":
            preds[i] = dataclasses.replace(preds[i], fallback_answer=r.answer)
    return preds


def run_mode(ctx: EvalContext, examples: Sequence[Example], cfg: ModeConfig) -> list[Prediction]:
    preds = RUNNERS[cfg.name](ctx, examples, cfg)
    return with_fallback(ctx, examples, preds, cfg.fallback_below) if cfg.fallback else preds
