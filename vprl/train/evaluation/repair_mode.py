"""The modes that write a program again after seeing what it did, as one episode loop
(`vprl.train.repair.turns.EpisodeLoop`, the loop RL's repair episodes run in):

- `repair`: learned repair. The next program is written in the conversation the policy was trained
  on: the prompt, the previous program's body, a feedback block (`RepairFormat.block_text`, plain
  text; a chat generator frames it as user/model turns, `frame_prompt`) and the opener again (the query and the signature),
  continued greedily. Every turn of an episode stays in the text, as in training.
- `self_debug`: the untrained case stopping at the first program that runs, the error shown in
  the papers' re-prompt (`PreviousAttempt`: a fresh prompt holding the failed program and its
  error); with `feedback: scratch`, a fresh sample of the same prompt instead.
- `reprompt_tests`: the untrained case stopping at a pass on the unit tests, the failed tests shown
  in the papers' re-prompt, keeping the better-scoring program (`keep: best`).

Every turn runs on the question's image through the context's runner (an answer of the wrong kind
is a `bad_return`, as in every mode) and, where the stop rule or `keep` needs it, is scored by the
unit-test judge, whose outcome rows the feedback shows. Nothing here reads an example's answers:
the feedback is built from the program's own run and its unit tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vprl.data.records import Example
from vprl.executor.results import ExecutionResult
from vprl.rewards.compose import RewardBatch
from vprl.rewards.feedback import Feedback, FeedbackConfig
from vprl.train.evaluation.judge import failed_tests_line
from vprl.train.evaluation.metrics import Prediction
from vprl.train.evaluation.mode_config import EvalContext, ModeConfig, UnitTestJudge, _need_judge, _run
from vprl.train.prompts import PreviousAttempt, completion_to_program
from vprl.train.prompts.conversation import RepairFormat, body_of, opener_of
from vprl.train.repair.episode import Episode, Turn
from vprl.train.repair.turns import EpisodeLoop, RepairConfig

UNIT_TESTS = "unit_tests"  # the judge's component, as the reward is named in training
REPROMPTS = ("conversation", "previous", "resample")


@dataclass(frozen=True)
class LoopPlan:
    """How a mode runs the loop. reprompt: "conversation" (learned repair), "previous" (the papers'
    re-prompt with the earlier attempt) or "resample" (a fresh sample of the prompt); keep: which
    turn answers ("final", or "best" by unit tests, programs that ran first); judged: every turn is
    scored on unit tests; sampled_later: the conversation's later programs are sampled, not greedy."""

    repair: RepairConfig
    reprompt: str
    keep: str = "final"
    judged: bool = False
    sampled_later: bool = False


def loop_plan(cfg: ModeConfig) -> LoopPlan:
    rounds = cfg.iterations + 1
    if cfg.name == "repair":
        check = UNIT_TESTS if cfg.stop_when == "passed" else None
        feedback = FeedbackConfig(
            stop_when=cfg.stop_when, check=check, pass_threshold=cfg.pass_threshold, show=tuple(cfg.show)
        )
        sampled = cfg.later_turns == "sampled"
        return LoopPlan(RepairConfig(cfg.turns, 0.0, feedback), "conversation", cfg.keep, cfg.needs_judge, sampled)
    if cfg.name == "self_debug":
        feedback = FeedbackConfig(stop_when="ran", show=("error",))
        reprompt = "previous" if cfg.feedback == "error" else "resample"
        return LoopPlan(RepairConfig(rounds, 0.0, feedback), reprompt)
    if cfg.name == "reprompt_tests":
        feedback = FeedbackConfig(
            stop_when="passed", check=UNIT_TESTS, pass_threshold=cfg.pass_threshold, show=(UNIT_TESTS,)
        )
        return LoopPlan(RepairConfig(rounds, 0.0, feedback), "previous", "best", True)
    raise ValueError(f"mode {cfg.name} does not write programs again")


@dataclass
class _Scored:
    results: list[ExecutionResult]
    rewards: RewardBatch


class EvalScorer:
    """The evaluation's `ProgramScorer` for the loop: runs programs through the context's runner and,
    with a judge, gives the unit-test component and its outcome rows. Remembers each (example,
    program)'s run and rows for the re-prompt that follows."""

    def __init__(self, ctx: EvalContext, judge: UnitTestJudge | None = None):
        self.ctx = ctx
        self.judge = judge
        self.seen: dict[tuple[str, str], tuple[ExecutionResult, list[dict[str, Any]]]] = {}

    def score(self, examples: Sequence[Example], programs: Sequence[str]) -> _Scored:
        results = _run(self.ctx, examples, programs)
        components: dict[str, list[float | None]] = {}
        details: dict[str, list[list[dict[str, Any]]]] = {}
        rows: list[list[dict[str, Any]]] = [[] for _ in programs]
        if self.judge is not None:
            reports = self.judge.reports(examples, programs)
            components[UNIT_TESTS] = [r.value for r in reports]
            rows = [[o.to_json() for o in r.outcomes] for r in reports]
            details[UNIT_TESTS] = rows
        for e, p, r, t in zip(examples, programs, results, rows):
            self.seen[(e.id, p)] = (r, t)
        totals = list(components.get(UNIT_TESTS, [None] * len(programs)))
        return _Scored(results, RewardBatch(totals, components, [r.status for r in results], details))


class _Writer:
    """`next_programs` for the loop: the next program of each row still going."""

    def __init__(self, ctx: EvalContext, examples: Sequence[Example], plan: LoopPlan, scorer: EvalScorer):
        self.ctx, self.examples, self.plan, self.scorer = ctx, examples, plan, scorer
        self.prompts = [ctx.prompt(e, None) for e in examples]
        self.texts = list(self.prompts)  # conversation: the episode's text up to its latest program
        self.programs: list[str] = []
        self.format = RepairFormat(None, "plain")  # the generator frames the text for its model

    def first(self) -> list[str]:
        self.programs = self._write(self.prompts, self.prompts, self.ctx.greedy)
        return list(self.programs)

    def __call__(self, rows: list[int], feedbacks: list[Feedback]) -> list[str | None]:
        sub = [self.examples[i] for i in rows]
        if self.plan.reprompt == "resample":  # a greedy decode would repeat the same program
            fresh = self._write([self.prompts[i] for i in rows], [self.prompts[i] for i in rows], self.ctx.sampling)
        elif self.plan.reprompt == "previous":
            prompts = [
                self.ctx.prompt(e, PreviousAttempt(self.programs[i], self._message(e, self.programs[i])))
                for e, i in zip(sub, rows)
            ]
            fresh = self._write(prompts, prompts, self.ctx.greedy)
        else:
            openers = [opener_of(self.prompts[i]) for i in rows]
            for i, feedback, opener in zip(rows, feedbacks, openers):
                self.texts[i] += body_of(self.programs[i]) + self.format.block_text(feedback, opener)
            later = self.ctx.sampling if self.plan.sampled_later else self.ctx.greedy
            fresh = self._write([self.texts[i] for i in rows], openers, later)
        for i, program in zip(rows, fresh):
            self.programs[i] = program
        return list(fresh)

    def _write(self, prompts: list[str], tails: list[str], sampling: Any) -> list[str]:
        completions = self.ctx.generator.generate(prompts, dataclasses.replace(sampling, n=1))
        return [completion_to_program(t, cs[0]) for t, cs in zip(tails, completions)]

    def _message(self, example: Example, program: str) -> str:
        """The papers' re-prompt text: the error (self-debugging) or the failed unit tests, as
        ViUniT words them (re-prompting)."""
        result, tests = self.scorer.seen[(example.id, program)]
        show = self.plan.repair.feedback.show
        failed = [t for t in tests if t.get("score") is None or float(t["score"]) < 1.0]
        if UNIT_TESTS in show and failed:
            line = failed_tests_line(tests)
            if result.status == "ok":
                return "it ran, but failed visual unit tests: " + line
            return f"{result.error or result.status}; it also failed visual unit tests: {line}"
        if result.status != "ok":
            return result.error or result.status
        return "it did not pass its checks"


def chosen_turn(episode: Episode, keep: str) -> Turn:
    """The turn whose answer the episode gives: the last, or (`best`) the one with the highest
    unit-test score among those that ran, the earliest of equals. Only the choice differs: the
    episodes are the same either way."""
    if keep == "final":
        return episode.final

    def key(turn: Turn) -> tuple[bool, float]:
        score = turn.components.get(UNIT_TESTS)
        return turn.status == "ok", score if score is not None else -1.0

    # max keeps the earliest of equals: a later program must do better to be taken
    return max(episode.turns, key=key)


def turn_row(turn: Turn) -> dict[str, Any]:
    """A turn as a prediction records it: without its tool calls (the chosen program's are the
    prediction's own)."""
    row = turn.to_json()
    row.pop("tool_calls", None)
    return row


def run_episodes(ctx: EvalContext, examples: Sequence[Example], cfg: ModeConfig) -> list[Prediction]:
    plan = loop_plan(cfg)
    judge = _need_judge(ctx, f"mode {cfg.name}") if plan.judged else None
    if plan.keep == "best" and judge is None:
        raise ValueError(f"mode {cfg.name}: keep 'best' compares unit-test scores and needs the judge")
    scorer = EvalScorer(ctx, judge)
    writer = _Writer(ctx, examples, plan, scorer)
    episodes = EpisodeLoop(scorer, plan.repair).run(examples, writer.first(), writer)
    preds = []
    for episode in episodes:
        turn = chosen_turn(episode, plan.keep)
        preds.append(
            Prediction(
                example_id=episode.example_id,
                answer=turn.answer if turn.status == "ok" else None,
                status=turn.status,
                program=turn.program,
                error=turn.error,
                tool_calls=list(turn.tool_calls),
                unit_test_score=turn.components.get(UNIT_TESTS),
                attempts=len(episode.turns),
                turns=[turn_row(t) for t in episode.turns],
            )
        )
    return preds
