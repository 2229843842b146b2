"""Repair examples for the tiny policy's bootstrap (`BootstrapConfig.repair_share`): a wrong program,
the feedback its real run gets, and the gold program after it.

A repair pair's prompt is what a repair episode shows the policy before its second program (the
plain frame of `vprl.train.prompts.conversation`: the bare prompt, the wrong body, the feedback
block, the signature again); its completion is the gold body, so the SFT loss covers only the
corrected program: the wrong program and the feedback are context.

The wrong programs are the world's mutations of the gold program (`vprl.data.shapes.mutations`:
they run and answer wrong) and, a `BROKEN_SHARE` of the time, one that does not run (`BREAKERS`: a
method the API does not have, a dropped closing bracket). With `repair_noun_share` N, a share N of
them are the tiny policy's commonest slip when it samples (`wrong_noun`: a `find`/`exists` phrase
naming another shape than the question's; mostly an IndexError at `[0]`, else a wrong answer). Each
is played as the first turn of a two-turn episode through the training's own `EpisodeLoop` (the
sandboxed runner, the rewards and the feedback `bench/repair.py` trains with: the error, the tool
calls, the failed visual unit tests; no label), and the gold program as its second. A wrong program whose run gets no feedback
(it passes its unit tests) makes no pair. The measurement plays the same episodes with the policy's
greedy programs (`repair_figure`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vprl.data.records import Example
from vprl.data.shapes.mutations import mutate
from vprl.data.shapes.scene import SHAPES
from vprl.executor.runner import SyncRunner
from vprl.rewards.build import build_rewards
from vprl.rewards.compose import RewardConfig
from vprl.rewards.feedback import FeedbackConfig
from vprl.train.bootstrap.check import bare_prompts, open_runner
from vprl.train.bootstrap.pairs import SFTPair, body
from vprl.train.prompts import completion_to_program
from vprl.train.prompts.conversation import body_of, conversation_text, signature_of
from vprl.train.repair.episode import resample_lift
from vprl.train.repair.turns import EpisodeLoop, RepairConfig
from vprl.train.rollouts.scorer import ProgramScorer
from vprl.train.sampling.generator import policy_sampling

# The visual unit tests that check a program and fill its feedback (bench/repair.py trains with them).
UNIT_TESTS = {"num_tests": 5, "sampler": "balanced", "compile_penalty": 1.0, "runtime_penalty": 0.5}
REPAIR_REWARDS = RewardConfig.from_json(
    {"rewards": [{"name": "correctness"}, {"name": "unit_tests", "weight": 0.0, "settings": UNIT_TESTS}]}
)
# The repair examples' text version, in the cache key of a bootstrap with repair examples: 2, the
# feedback block ends with the prompt's query and signature (`conversation.opener_of`), not the
# signature alone.
REPAIR_FORMAT = 2
REPAIR_FEEDBACK = FeedbackConfig(stop_when="passed", check="unit_tests", show=("error", "trace", "unit_tests"))
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


def wrong_noun(src: str, rng: np.random.Generator) -> str:
    """The first `find`/`exists` phrase ending in a shape names another shape (drawn), at its first
    use: "cyan star" -> "cyan hexagon". The sampled programs of the tiny policy slip so most often
    (the RL runs' first programs failed with an IndexError a third of the time, nine in ten of them
    on a noun the question does not hold; docs/repair.md)."""
    for m in re.finditer(r'\b(?:find|exists)\("((?:[\w ]+ )?)(\w+)"\)', src):
        if m.group(2) in SHAPES:
            others = [s for s in SHAPES if s != m.group(2)]
            return src[: m.start(2)] + others[int(rng.integers(len(others)))] + src[m.end(2) :]
    return src


def broken(program: str) -> dict[str, str]:
    """Each breaker's program where it changes `program` (by kind)."""
    return {kind: out for kind, edit in BREAKERS.items() if (out := edit(program)) != program}


def repair_loop(runner: SyncRunner, work: Path, show: Sequence[str] = REPAIR_FEEDBACK.show) -> EpisodeLoop:
    """Two-turn episodes on the bootstrap's tools with the repair run's rewards and feedback (the
    parts in `show`: the bootstrap's `repair_feedback`); the unit tests and their images are cached
    in <work>/unit_test_cache, as in a run folder."""
    rewards = build_rewards(REPAIR_REWARDS, resources={"runner": runner, "run_dir": str(work)})
    feedback = replace(REPAIR_FEEDBACK, show=tuple(show))
    return EpisodeLoop(ProgramScorer(runner, rewards), RepairConfig(2, 0.0, feedback))


def repair_pairs(
    loop: EpisodeLoop, examples: Sequence[Example], gold: dict[str, str], wrong: Sequence[tuple[str, str]]
) -> list[SFTPair]:
    """SFT pairs teaching the repair of `wrong[i]` = (kind, program) on `examples[i]`: the episode's
    first turn is the wrong program, its second the gold (`gold[query]`); a pair's prompt is the
    conversation up to the second program, its completion the gold body. Rows whose first program
    gets no feedback make no pair; the others keep their order (kind `repair:<kind>`)."""
    if len(examples) != len(wrong):
        raise ValueError(f"got {len(examples)} examples and {len(wrong)} wrong programs")
    prompts = bare_prompts(examples)

    def gold_after(rows: list[int], _feedbacks: list) -> list[str]:
        return [gold[examples[i].query] for i in rows]

    played = loop.run(examples, [p for _, p in wrong], gold_after)
    pairs = []
    for ex, (kind, program), prompt, episode in zip(examples, wrong, prompts, played, strict=True):
        feedback = episode.turns[0].feedback
        if feedback is None:
            continue
        context = conversation_text(prompt, [body(program)], [feedback])
        pairs.append(SFTPair(ex.id, ex.group or "", f"repair:{kind}", context, body(gold[ex.query])))
    return pairs


def draw_wrong(
    examples: Sequence[Example], gold: dict[str, str], n: int, rng: np.random.Generator, noun_share: float = 0.0
) -> tuple[list[Example], list[tuple[str, str]]]:
    """`n` (example, (kind, wrong program)) draws: a uniform example, then a wrong noun `noun_share`
    of the time where the program has one, else a breaker `BROKEN_SHARE` of the time (else a
    mutation; whichever the example has). At `noun_share` 0 the draws are those of before it."""
    out_ex, out_wrong = [], []
    for _ in range(n):
        ex = examples[int(rng.integers(len(examples)))]
        program = gold[ex.query]
        if noun_share > 0 and rng.random() < noun_share and (slip := wrong_noun(program, rng)) != program:
            out_ex.append(ex)
            out_wrong.append(("wrong_noun", slip))
            continue
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
    pairs: list[SFTPair], examples: Sequence[Example], gold: dict[str, str], cfg: Any, root: Path, work: Path
) -> tuple[list[SFTPair], dict[str, Any]]:
    """`pairs` with repair pairs mixed in so that they are `cfg.repair_share` of all, drawn from
    `examples` with a generator of their own (`[seed, 3]`, so the rest of the mixture is drawn as
    without them); returns the shuffled pairs and what was drawn."""
    want = int(round(cfg.repair_share * len(pairs) / (1 - cfg.repair_share)))
    rng = np.random.default_rng([cfg.seed, 3])
    # A mutation passes its unit tests now and then (no feedback, no pair): draw more than wanted.
    drawn_ex, drawn = draw_wrong(examples, gold, 2 * want + 8, rng, cfg.repair_noun_share)
    with open_runner(cfg, root) as runner:
        made = repair_pairs(repair_loop(runner, work, cfg.repair_feedback), drawn_ex, gold, drawn)[:want]
    kinds: dict[str, int] = {}
    for p in made:
        kinds[p.kind] = kinds.get(p.kind, 0) + 1
    info = {"wanted": want, "drawn": len(drawn), "pairs": len(made), "kinds": dict(sorted(kinds.items()))}
    both = pairs + made
    return [both[int(i)] for i in rng.permutation(len(both))], info


def within_context(pairs: list[SFTPair], tokenizer: Any, context: int) -> tuple[list[SFTPair], int]:
    """`pairs` less the repair pairs longer than `context` tokens (SFT would cut their completion
    off); returns them and how many went."""
    kept = [
        p
        for p in pairs
        if not p.kind.startswith("repair:")
        or len(tokenizer(p.prompt + p.completion, add_special_tokens=True)["input_ids"]) + 1 <= context
    ]
    return kept, len(pairs) - len(kept)


REPAIR_PAIRS_FILE = "repair_pairs.jsonl"  # in the bootstrap's folder


def save_repair_pairs(pairs: Sequence[SFTPair], path: Path) -> int:
    """The repair pairs of `pairs` (as SFT was given them), one JSON object a line; returns how many."""
    repair = [p for p in pairs if p.kind.startswith("repair:")]
    with open(path, "w", encoding="utf-8") as f:
        for p in repair:
            f.write(json.dumps(p.to_json()) + "\n")
    return len(repair)


def load_repair_pairs(path: Path) -> list[SFTPair]:
    """What `save_repair_pairs` wrote; a line that is not a repair pair is an error naming it."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                pair = SFTPair(**json.loads(line))
            except (json.JSONDecodeError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a repair pair ({e})") from e
            if not pair.kind.startswith("repair:"):
                raise ValueError(f"{path}:{n}: kind {pair.kind!r} is not a repair pair's")
            out.append(pair)
    return out


def repair_figure(
    model, tokenizer, examples: Sequence[Example], root: Path, work: Path, cfg: Any, sampled: bool = False
) -> dict[str, Any]:
    """Two-turn episodes of the policy on `examples`, the figures of `episode_stats` that matter
    before RL: how many first programs got feedback; of those that were wrong, the share whose
    second program is right (`repaired`); of those that were right (feedback from a failed unit
    test), the share made wrong (`broken`); and of the second programs, the share that pass their
    unit tests (`passed`), that run (`ran`) and that are the first one again (`unchanged`); sampled,
    how much more often a second program is right than a fresh first program of its question
    (`resample_lift`: near 0, the second turn ignores its feedback).
    Greedy, or with `sampled` as RL samples (`cfg.num_generations` episodes per example at
    `cfg.temperature`), where the first programs' slips are the ones RL's episodes meet."""
    from vprl.train.sampling.hf import HFGenerator

    k = cfg.num_generations if sampled else 1
    settings = dict(temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed) if sampled else dict(temperature=0)
    sampling = policy_sampling(max_new_tokens=cfg.max_completion_length, **settings)
    examples = [e for e in examples for _ in range(k)]
    prompts = bare_prompts(examples)
    generator = HFGenerator(model, tokenizer, batch_size=64, style="plain")
    unique = prompts[::k]
    firsts = generator.generate(unique, replace(sampling, n=k))
    first = [completion_to_program(p, c) for p, cs in zip(unique, firsts, strict=True) for c in cs]

    def next_programs(rows: list[int], feedbacks: list) -> list[str]:
        texts = [
            conversation_text(prompts[i], [body_of(first[i])], [fb]) for i, fb in zip(rows, feedbacks, strict=True)
        ]
        outs = generator.generate(texts, sampling)
        return [completion_to_program(signature_of(prompts[i]), c[0]) for i, c in zip(rows, outs, strict=True)]

    with open_runner(cfg, root) as runner:
        played = repair_loop(runner, work, cfg.repair_feedback).run(examples, first, next_programs)
    repaired = [e for e in played if len(e.turns) == 2]

    def right(turn) -> bool:
        return (turn.components.get("correctness") or 0.0) >= 1.0

    wrong = [e for e in repaired if not right(e.turns[0])]
    was_right = [e for e in repaired if right(e.turns[0])]

    def share(rows: list, keep) -> float | None:
        return round(sum(map(keep, rows)) / len(rows), 4) if rows else None

    return {
        "got_feedback": len(repaired),
        "first_wrong": len(wrong),
        "repaired": share(wrong, lambda e: right(e.turns[1])),
        "broken": share(was_right, lambda e: not right(e.turns[1])),
        "passed": share(repaired, lambda e: e.turns[1].passed),
        "ran": share(repaired, lambda e: e.turns[1].status == "ok"),
        "unchanged": share(repaired, lambda e: e.turns[1].program.strip() == e.turns[0].program.strip()),
        # sampled: does the second program beat a fresh first program of its question (None greedy: one each)
        "resample_lift": None if (lift := resample_lift(played)) is None else round(lift, 4),
    }


def repair_figures(model, tokenizer, examples: Sequence[Example], root: Path, work: Path, cfg: Any) -> dict[str, Any]:
    """`repair_figure`'s greedy figures, with its sampled ones under `sampled`."""
    figure = repair_figure(model, tokenizer, examples, root, work, cfg)
    return {**figure, "sampled": repair_figure(model, tokenizer, examples, root, work, cfg, sampled=True)}
