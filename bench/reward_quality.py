"""How well do the label-free rewards tell gold programs from wrong ones? Prints figures; asserts nothing.

    python bench/reward_quality.py [--pairs 240] [--world DIR] [--val 40] [--backends oracle,shapes]
                            [--rewards unit_tests,verifier,correctness] [--seed 0] [--slots 2]
                            [--unit_test_variants '[{}, {"sampler": "balanced", "num_tests": 6}]']

On a generated shapes world (built in a temporary folder unless `--world` names one):

1. pairs: a question's gold program and one mutant of it (`vprl.data.shapes.mutations`: flipped
   comparisons, left/right, wrong index, wrong attribute, ...) or, on yes/no questions, a program
   that always answers "yes" (or "no"), on the same example, kept only where the wrong program is
   actually wrong there (its correctness is below the gold's); at least `--pairs`;
2. AUC per reward (`unit_tests` once per settings variant): the share of pairs where the reward ranks gold above the mutant (ties count
   1/2), on the composer's total with this reward alone: failed programs get the default penalties,
   a reward that says nothing (None) adds 0; the share of None among programs that ran is shown;
3. correlation (Pearson and Spearman) of each reward with correctness over all the programs;
4. cost per program of each reward: *cold* = a fresh reward object on a fresh tool host whose cache
   holds only the programs' own calls (as in training, where the reward runs right after the
   programs), *warm* = the same call repeated (every cache filled).

`correctness` reads the labels: it is the labelled reference, its AUC is 1 by construction.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vprl.data.records import Example  # noqa: E402
from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs  # noqa: E402
from vprl.data.shapes.mutations import mutate  # noqa: E402
from vprl.data.shapes.tasks import load_shapes_tasks  # noqa: E402
from vprl.executor.backends import open_backend  # noqa: E402
from vprl.executor.host import ToolHost  # noqa: E402
from vprl.executor.runner import RunnerConfig, SyncRunner  # noqa: E402
from vprl.rewards.compose import RewardComposer, RewardConfig  # noqa: E402
from vprl.rewards.correctness import correctness  # noqa: E402
from vprl.rewards.registry import reward_names  # noqa: E402

TASK_NAMES = ("val", "heldout", "winoground", "sugarcrepe", "refcoco")


@dataclass(frozen=True)
class Candidate:
    """A gold program and a wrong one of some kind (a mutant, or a constant answer), on one example."""

    example: Example
    gold: str
    kind: str
    program: str


def constant_program(answer: str) -> str:
    return f"def execute_command(image) -> str:\n    return {answer!r}\n"


def candidate_pairs(root: Path, seed: int, constants: bool = True) -> list[Candidate]:
    """Every (example, gold, mutant) of the world's evaluation tasks, and for yes/no questions the
    programs that always answer "yes" and always "no" (what a label-free reward must not pay for),
    shuffled."""
    gold = load_gold_programs(root)
    tasks = load_shapes_tasks(root, list(TASK_NAMES))
    pairs = []
    for name in TASK_NAMES:
        for example in tasks[name]:
            program = gold.get(example.task, {}).get(example.query)
            if program is None:
                continue
            pairs.extend(Candidate(example, program, m.kind, m.program) for m in mutate(program))
            if constants and example.task == "vqa" and set(example.answers) <= {"yes", "no"}:
                pairs.extend(Candidate(example, program, f"always_{a}", constant_program(a)) for a in ("yes", "no"))
    random.Random(seed).shuffle(pairs)
    return pairs


def reward_variants(names: list[str], unit_test_variants: list[dict]) -> list[tuple[str, str, dict]]:
    """(label, reward name, settings) per reward to measure; `unit_tests` once per variant."""
    out = []
    for name in names:
        if name != "unit_tests":
            out.append((name, name, {}))
            continue
        for variant in unit_test_variants:
            label = "unit_tests" + "".join(f" {k}={v}" for k, v in variant.items())
            out.append((label, name, dict(variant)))
    return out


def auc(pairs_scores: list[tuple[float, float]]) -> float:
    wins = sum(1.0 if g > m else 0.5 if g == m else 0.0 for g, m in pairs_scores)
    return wins / len(pairs_scores) if pairs_scores else math.nan


def pearson(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return math.nan
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2.0  # ties share their mean rank
        i = j + 1
    return out


def run_backend(backend_name: str, root: Path, candidates: list[Candidate], args, workdir: Path) -> list[dict]:
    # 1. execute gold and mutants; keep pairs whose mutant is wrong on the example
    examples = [c.example for c in candidates for _ in (0, 1)]
    programs = [s for c in candidates for s in (c.gold, c.program)]
    with SyncRunner(ToolHost(open_backend(backend_name, worlds=[root])), RunnerConfig(slots=args.slots)) as r:
        results = r.run(list(zip(examples, programs)))
    kept: list[int] = []
    for i in range(len(candidates)):
        g, m = results[2 * i], results[2 * i + 1]
        if g.status == "infra_error" or m.status == "infra_error":
            continue
        cg = correctness(examples[2 * i], g.answer) if g.ok else 0.0
        cm = correctness(examples[2 * i], m.answer) if m.ok else 0.0
        if cg > cm:
            kept.append(i)
        if len(kept) >= args.pairs:
            break
    if len(kept) < args.pairs:
        print(f"[{backend_name}] only {len(kept)} pairs with a wrong mutant (asked for {args.pairs})")
    idx = [j for i in kept for j in (2 * i, 2 * i + 1)]
    ex = [examples[j] for j in idx]
    progs = [programs[j] for j in idx]
    corr = [correctness(ex[k], results[j].answer) if results[j].ok else 0.0 for k, j in enumerate(idx)]
    kinds = Counter(candidates[i].kind for i in kept)
    print(f"[{backend_name}] {len(kept)} pairs; mutation kinds: {dict(kinds.most_common())}")

    rows = []
    for number, (label, name, settings) in enumerate(reward_variants(args.rewards, args.unit_test_variants)):
        # 2. a fresh host re-runs the programs (its cache then holds their calls), then the reward, twice
        host = ToolHost(open_backend(backend_name, worlds=[root]))
        with SyncRunner(host, RunnerConfig(slots=args.slots)) as runner:
            res = runner.run(list(zip(ex, progs)))
            if name == "unit_tests":
                settings = {**settings, "cache_dir": str(workdir / f"{backend_name}-{name}-{number}")}
            spec = {"name": name, "settings": settings}
            composer = RewardComposer(RewardConfig.from_json({"rewards": [spec]}), {"runner": runner})
            ok = [k for k, rr in enumerate(res) if rr.ok]

            def score(composer=composer, res=res, name=name):
                batch = composer(ex, res, progs)
                return batch.totals, batch.components[name]

            calls0 = host.metrics()["backend_calls"]
            t0 = time.perf_counter()
            values, component = score()
            cold = (time.perf_counter() - t0) / len(progs)
            calls1 = host.metrics()["backend_calls"]
            t0 = time.perf_counter()
            again, _ = score()
            warm = (time.perf_counter() - t0) / len(progs)
            calls2 = host.metrics()["backend_calls"]
        if again != values:
            print(f"[{backend_name}] note: {label} gave different values on the warm call")
        none = sum(component[k] is None for k in ok)
        # The composer's total: the reward for programs that ran (None -> 0), penalties for failures;
        # infra errors were excluded from the pairs.
        filled = [0.0 if v is None else float(v) for v in values]
        pair_scores = [(filled[2 * i], filled[2 * i + 1]) for i in range(len(kept))]
        by_kind = defaultdict(list)
        for i, pair_index in enumerate(kept):
            by_kind[candidates[pair_index].kind].append(pair_scores[i])
        rows.append(
            {
                "backend": backend_name,
                "reward": label,
                "auc": auc(pair_scores),
                "pearson": pearson(filled, corr),
                "spearman": pearson(ranks(filled), ranks(corr)),
                "none": none / max(len(ok), 1),
                "cold_ms": 1000 * cold,
                "warm_ms": 1000 * warm,
                "cold_tool_calls": (calls1 - calls0) / len(progs),
                "warm_tool_calls": (calls2 - calls1) / len(progs),
                "by_kind": {k: (auc(v), len(v)) for k, v in sorted(by_kind.items())},
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=240, help="(gold, wrong mutant) pairs per backend")
    parser.add_argument("--world", type=Path, help="a generated shapes world; default: build one")
    parser.add_argument("--val", type=int, default=60, help="held-out images when building the world")
    parser.add_argument("--backends", default="shapes,oracle")
    parser.add_argument("--rewards", default="unit_tests,verifier,correctness")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument(
        "--unit_test_variants",
        default='[{}, {"sampler": "balanced", "num_tests": 6}]',
        help="JSON list of unit_tests settings, each measured as its own row",
    )
    parser.add_argument("--no_constants", action="store_true", help="leave out the constant-answer programs")
    args = parser.parse_args(argv)
    args.unit_test_variants = json.loads(args.unit_test_variants)
    args.rewards = [r for r in args.rewards.split(",") if r]
    missing = sorted(set(args.rewards) - set(reward_names()))
    if missing:
        print(f"skipping rewards not registered: {missing} (registered: {reward_names()})")
        args.rewards = [r for r in args.rewards if r not in missing]
    with tempfile.TemporaryDirectory(prefix="bench-rewards-") as tmp:
        workdir = Path(tmp)
        root = args.world
        if root is None:
            root = workdir / "world"
            build_dataset(BuildConfig(out=str(root), train=10, val=args.val, seed=args.seed))
        candidates = candidate_pairs(root, args.seed, constants=not args.no_constants)
        # Mutants are wrong on about half their examples: run enough candidates to keep --pairs.
        candidates = candidates[: 4 * args.pairs]
        rows = []
        for backend in [b for b in args.backends.split(",") if b]:
            rows += run_backend(backend, root, candidates, args, workdir)
    header = (
        f"{'backend':8} {'reward':36} {'AUC':>6} {'pearson':>8} {'spearman':>9} {'None%':>6} "
        f"{'cold ms/prog':>13} {'warm ms/prog':>13} {'cold calls':>11} {'warm calls':>11}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for r in rows:
        print(
            f"{r['backend']:8} {r['reward']:36} {r['auc']:6.3f} {r['pearson']:8.3f} {r['spearman']:9.3f} "
            f"{100 * r['none']:5.1f}% {r['cold_ms']:13.2f} {r['warm_ms']:13.2f} "
            f"{r['cold_tool_calls']:11.2f} {r['warm_tool_calls']:11.2f}"
        )
    print("\nAUC by mutation kind (pairs):")
    for r in rows:
        if r["reward"] == "correctness":
            continue
        kinds = ", ".join(f"{k} {a:.2f} ({n})" for k, (a, n) in r["by_kind"].items())
        print(f"  {r['backend']:8} {r['reward']:36} {kinds}")


if __name__ == "__main__":
    main()
