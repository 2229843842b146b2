"""What became of the wrong first programs a repair run sent back, from its training episodes: per
seed, over the first and the last `--window` steps, the wrong first programs, the share that got
feedback, and of those the share repaired and the share whose later program failed to run, was the
first program again, gave the first one's answer again, or gave another wrong one. With the training
questions (the policy's world, which each record names): how often the later program looks for an
object its question never names, and the repair rate on each side of that. Prints figures; asserts
nothing.

    python bench/repair_outcomes.py runs/fl_s0,runs/fl_s1,runs/fl_s2 [--arm repair] [--window 20]
        [--json runs/fl_outcomes.json]

"Names an object the question does not": a `find` or `exists` argument whose last word, a trailing
"s" dropped, is no word of the question (the same cut). A heuristic that fits the shapes world's
one-word nouns; on real GQA it would also count synonyms.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.repair_paired import arm_records  # noqa: E402
from bench.repair_report import episodes_by_step, print_figures  # noqa: E402
from vprl.data.shapes.tasks import load_shapes_task  # noqa: E402
from vprl.executor.program import program_key  # noqa: E402
from vprl.train.repair.episode import Episode  # noqa: E402

OUTCOMES = ("repaired", "fails_to_run", "repeats_first", "same_answer", "other_wrong")
_OBJECT_CALL = re.compile(r"\.(?:find|exists)\(\s*[\"']([^\"']+)[\"']")
_WORD = re.compile(r"[a-z]+")


def _stem(word: str) -> str:
    return word[:-1] if word.endswith("s") else word


def names_an_object_off_question(program: str, question: str) -> bool:
    words = {_stem(w) for w in _WORD.findall(question.lower())}
    heads = [_WORD.findall(arg.lower()) for arg in _OBJECT_CALL.findall(program)]
    return any(head and _stem(head[-1]) not in words for head in heads)


def outcome(episode: Episode) -> str:
    """What the final program of an episode whose wrong first program got feedback did."""
    first, final = episode.first, episode.final
    if final.right():
        return "repaired"
    if final.status != "ok":
        return "fails_to_run"
    if program_key(final.program) == program_key(first.program):
        return "repeats_first"
    return "same_answer" if final.answer == first.answer else "other_wrong"


def window_figures(episodes: Iterable[Episode], questions: Mapping[str, str]) -> dict:
    """The figures of one window's episodes (a first program copied for `repair_branches` is counted
    once). `questions` maps an example id to its question; ids it lacks are left out of the
    off-question split, not guessed."""
    wrong = [e for e in episodes if not e.shared_first and not e.first.right()]
    sent = [e for e in wrong if len(e.turns) > 1]
    counts = Counter(outcome(e) for e in sent)
    out: dict = {"wrong_first": len(wrong), "sent_back": len(sent) / len(wrong) if wrong else None}
    out["outcomes"] = {k: counts[k] / len(sent) if sent else None for k in OUTCOMES}
    known = [e for e in sent if e.example_id in questions]
    is_off = [names_an_object_off_question(e.final.program, questions[e.example_id]) for e in known]
    off = [e for e, flag in zip(known, is_off) if flag]
    on = [e for e, flag in zip(known, is_off) if not flag]
    out["later_names_off_question"] = len(off) / len(known) if known else None
    first_off = sum(names_an_object_off_question(e.first.program, questions[e.example_id]) for e in known)
    out["first_names_off_question"] = first_off / len(known) if known else None
    for name, group in (("repaired_when_off", off), ("repaired_when_on", on)):
        out[name] = sum(e.final.right() for e in group) / len(group) if group else None
    return out


def run_figures(run_dir: Path, questions: Mapping[str, str], window: int) -> dict:
    by_step = episodes_by_step(run_dir)
    steps = sorted(by_step)
    if not steps:
        raise SystemExit(f"repair_outcomes: {run_dir} holds no training episodes")
    windows = {"first": steps[:window], "last": steps[-window:]}
    out = {}
    for name, chosen in windows.items():
        out[name] = {
            "steps": [chosen[0], chosen[-1]],
            **window_figures((e for s in chosen for e in by_step[s]), questions),
        }
    return out


def training_questions(world: str | Path) -> dict[str, str]:
    return {e.id: e.query for e in load_shapes_task(world, "train")}


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}"


def markdown(per_seed: Mapping[int, dict]) -> str:
    head = (
        "| seed | steps | wrong first | sent back | "
        + " | ".join(OUTCOMES)
        + " | names an object off the question: first / later | repaired, later off / on |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for seed, figures in per_seed.items():
        for f in figures.values():
            outcomes = " | ".join(_pct(f["outcomes"][k]) for k in OUTCOMES)
            lines.append(
                f"| {seed} | {f['steps'][0]}–{f['steps'][1]} | {f['wrong_first']} | {_pct(f['sent_back'])} | {outcomes} | "
                f"{_pct(f['first_names_off_question'])} / {_pct(f['later_names_off_question'])} | {_pct(f['repaired_when_off'])} / {_pct(f['repaired_when_on'])} |"
            )
    return "\n".join(
        lines + ["", "in %: `sent back` of the wrong first programs, the rest of the wrong first programs sent back"]
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", help="comma list of bench/repair.py --out folders (one per seed, or one collected)")
    parser.add_argument("--arm", default="repair", help="the arm read (default: repair)")
    parser.add_argument("--window", type=int, default=20, help="steps per window (default: 20)")
    parser.add_argument("--json", default="", help="also write the figures to this file")
    args = parser.parse_args(argv)
    records = arm_records(args.folders, args.arm)
    if not records:
        raise SystemExit(f"repair_outcomes: no {args.arm} record in {args.folders}")
    per_seed = {
        seed: run_figures(Path(record["run_dir"]), training_questions(record["seen_from"]), args.window)
        for seed, (record, _) in sorted(records.items())
    }
    return print_figures(per_seed, markdown(per_seed), args.json)


if __name__ == "__main__":
    main()
