"""Repair examples for the tiny policy's bootstrap (`BootstrapConfig.repair_share`): a wrong program,
the feedback its real run gets, and the gold program after it.

A repair pair's prompt is the conversation a repair episode shows the policy before its second
program (`vprl.train.prompts.conversation.conversation_text`, the plain frame: the bare prompt, the
wrong body, the feedback block, the signature again) and its completion is the gold body, so the
SFT loss covers only the corrected program: the wrong program and the feedback are context.

The wrong programs are the world's mutations of the gold program (`vprl.data.shapes.mutations`:
they run and answer wrong, and get the trace and the verdict) and, a `BROKEN_SHARE` of the time,
a broken program that does not run (`BREAKERS`: a method name that does not exist, a dropped
closing bracket; it gets its error with its line). Every one is run in the sandboxed executor on
its example and scored by the correctness reward; the message is `turn_feedback`'s with the
labelled repair settings (`REPAIR_FEEDBACK`), so it holds only what the program's own run shows,
never the question's answer. A program that turns out right on its example makes no pair.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vprl.data.records import Example
from vprl.data.shapes.mutations import mutate
from vprl.rewards.correctness import correctness
from vprl.rewards.feedback import FeedbackConfig, turn_feedback
from vprl.train.prompts import PromptConfig, PromptTemplate, completion_to_program
from vprl.train.prompts.conversation import conversation_text

# What a labelled repair run shows (docs/repair.md): the error, the trace and the verdict.
REPAIR_FEEDBACK = FeedbackConfig(stop_when="passed", check="correctness", show=("error", "trace", "verdict"))
BROKEN_SHARE = 0.25  # of the drawn wrong programs, those broken so that they do not run
# Method names a code LLM makes up for the API's own (the first call of one is renamed).
WRONG_NAMES = {
    "find": "find_all",
    "exists": "exist",
    "simple_query": "query",
    "best_text_match": "text_match",
    "verify_property": "has_property",
}


def misnamed_method(src: str) -> str:
    """The first API method call renamed to one that does not exist: AttributeError on its line."""
    names = "|".join(WRONG_NAMES)
    return re.sub(rf"\.({names})\(", lambda m: f".{WRONG_NAMES[m.group(1)]}(", src, count=1)


def dropped_bracket(src: str) -> str:
    """The program's last closing bracket dropped: it does not parse."""
    at = src.rfind(")")
    return src if at < 0 else src[:at] + src[at + 1 :]


BREAKERS: dict[str, Callable[[str], str]] = {"misnamed_method": misnamed_method, "dropped_bracket": dropped_bracket}


def broken(program: str) -> dict[str, str]:
    """Each breaker's program where it changes `program` (by kind)."""
    return {kind: out for kind, edit in BREAKERS.items() if (out := edit(program)) != program}


def body(program: str) -> str:
    """What the policy writes after the signature: the program without its `def` line."""
    head, sep, rest = program.partition("\n")
    return "\n" + rest if sep and head.startswith("def ") else "\n" + program


def repair_pairs(
    examples: Sequence[Example],
    gold: dict[str, str],
    wrong: Sequence[tuple[str, str]],
    runner: Any,
    family_of: Callable[[Example], str] | None = None,
) -> list[Any]:
    """SFT pairs teaching the repair of `wrong[i]` = (kind, program) on `examples[i]`: each wrong
    program is run through `runner` (a `SyncRunner`) as the policy would have written it after the
    bare prompt, scored by `correctness`, and given `REPAIR_FEEDBACK`'s message; the pair's prompt
    is the conversation up to the second program, its completion the gold body (`gold[query]`).
    Rows whose program is right (or whose run is our own failure) give no pair; the others keep
    their order. Pairs are `SFTPair`s with kind `repair:<kind>`."""
    from vprl.train.bootstrap.fit import SFTPair

    if len(examples) != len(wrong):
        raise ValueError(f"got {len(examples)} examples and {len(wrong)} wrong programs")
    templates: dict[str, PromptTemplate] = {}
    prompts, programs = [], []
    for ex, (_, program) in zip(examples, wrong):
        if ex.task not in templates:
            templates[ex.task] = PromptTemplate.from_config(PromptConfig(layout="bare", task=ex.task))
        prompts.append(templates[ex.task].build(ex.query))
        programs.append(completion_to_program(prompts[-1], body(program)))
    results = runner.run(list(zip(examples, programs)))
    pairs = []
    for ex, (kind, _), prompt, program, result in zip(examples, wrong, prompts, programs, results):
        score = correctness(ex, result.answer) if result.ok else 0.0
        feedback = turn_feedback(REPAIR_FEEDBACK, result, {"correctness": score})
        if feedback is None:  # right after all, or never judged
            continue
        context = conversation_text(prompt, [body(program)], [feedback])
        family = family_of(ex) if family_of else ex.group or ""
        pairs.append(SFTPair(ex.id, family, f"repair:{kind}", context, body(gold[ex.query])))
    return pairs


def draw_wrong(
    examples: Sequence[Example], gold: dict[str, str], n: int, rng: np.random.Generator
) -> tuple[list[Example], list[tuple[str, str]]]:
    """`n` (example, (kind, wrong program)) draws: a uniform example, then a breaker `BROKEN_SHARE`
    of the time (else a mutation; whichever the example has)."""
    out_ex, out_wrong = [], []
    for _ in range(n):
        ex = examples[int(rng.integers(len(examples)))]
        program = gold[ex.query]
        mutants = {m.kind: m.program for m in mutate(program)}
        breaks = broken(program)
        options = breaks if (rng.random() < BROKEN_SHARE and breaks) or not mutants else mutants
        if not options:
            continue
        kind = sorted(options)[int(rng.integers(len(options)))]
        out_ex.append(ex)
        out_wrong.append((kind, options[kind]))
    return out_ex, out_wrong


def add_repair_pairs(
    pairs: list[Any], examples: Sequence[Example], gold: dict[str, str], cfg: Any, root: Path
) -> tuple[list[Any], dict[str, Any]]:
    """`pairs` with repair pairs mixed in so that they are `cfg.repair_share` of all, drawn from
    `examples` with a generator of their own (`[seed, 3]`) and run with the bootstrap's tools;
    returns the shuffled pairs and what was drawn."""
    from vprl.executor.host import ToolHost
    from vprl.executor.runner import RunnerConfig, SyncRunner
    from vprl.train.bootstrap.check import tool_backend

    want = int(round(cfg.repair_share * len(pairs) / (1 - cfg.repair_share)))
    rng = np.random.default_rng([cfg.seed, 3])
    # Some draws answer right on their example (a mutation is not wrong on every image): draw more.
    drawn_ex, drawn = draw_wrong(examples, gold, 2 * want + 8, rng)
    backend = tool_backend(cfg.tool_stack, root)
    with SyncRunner(ToolHost(backend), RunnerConfig(slots=cfg.executor_slots, sandbox=cfg.executor_sandbox)) as runner:
        made = repair_pairs(drawn_ex, gold, drawn, runner)[:want]
    kinds: dict[str, int] = {}
    for p in made:
        kinds[p.kind] = kinds.get(p.kind, 0) + 1
    info = {"wanted": want, "drawn": len(drawn), "pairs": len(made), "kinds": dict(sorted(kinds.items()))}
    both = pairs + made
    return [both[int(i)] for i in rng.permutation(len(both))], info


def within_context(pairs: list[Any], tokenizer: Any, context: int) -> tuple[list[Any], int]:
    """`pairs` less the repair pairs longer than `context` tokens (SFT would cut their completion
    off); returns them and how many went."""
    kept = [
        p
        for p in pairs
        if not p.kind.startswith("repair:")
        or len(tokenizer(p.prompt + p.completion, add_special_tokens=True)["input_ids"]) + 1 <= context
    ]
    return kept, len(pairs) - len(kept)
