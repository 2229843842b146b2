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
from collections.abc import Sequence
from typing import Any

from vprl.data.records import Example
from vprl.executor.results import ExecutionResult
from vprl.rewards.answer_normalization import answer_to_text, normalize_answer
from vprl.train.evaluation.metrics import Prediction
from vprl.train.evaluation.mode_config import (  # noqa: F401  (the modes' public names, re-exported)
    EVAL_PARTS,
    FEEDBACK,
    KEEP,
    MODES,
    EvalContext,
    ModeConfig,
    UnitTestJudge,
    _checked_kind,
    _generate,
    _need_judge,
    _prediction,
    _run,
)
from vprl.train.evaluation.repair_mode import run_episodes


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
    return run_episodes(ctx, examples, cfg)


def self_debug(ctx: EvalContext, examples: Sequence[Example], cfg: ModeConfig) -> list[Prediction]:
    """Stanić et al.'s self-debugging: the repair loop's untrained case, stopping at the first program
    that runs, with its error in the papers' re-prompt (or, from scratch, a fresh sample)."""
    return run_episodes(ctx, examples, cfg)


def repair(ctx: EvalContext, examples: Sequence[Example], cfg: ModeConfig) -> list[Prediction]:
    """Learned repair: feedback in the conversation the policy was trained on, K turns at most."""
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
