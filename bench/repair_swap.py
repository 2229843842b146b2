"""Whose repairer is it? (#35) Why a repair run's second program stops beating a fresh sample: did RL
make the policy forget how to read its feedback, or did it fold the fixable mistakes into the first
program, leaving wrong first programs no feedback can fix? Prints figures; asserts nothing.

    python bench/repair_swap.py --out runs/br_s0 --seeds 0 --single_from runs/rc_s0   # one call per seed,
    python bench/repair_swap.py --collect runs/br_s0/swap_seed0.json,...                # side by side; then
        [--samples 8] [--pairs BB,RR,RB,SB,SS] [--threads 1]

On a `bench/repair.py` folder (its policies, its repair arm's adapters, its evaluation world; the
single arm's adapters from `--single_from`), for the evaluation's unseen training-family questions,
each asked `--samples` times: a first program sampled from one policy, run, and where it fails its
unit tests (the repair arm's training threshold) shown its feedback, the second program sampled from
a policy of the pair, in the repair conversation. Policies: B, the bootstrap (before RL); R, after
RL over repair episodes; S, after RL on one program per question. A pair XY: first programs by X,
second programs by Y.

Figures per pair, over seeds: `resample_lift` (how much more often Y's second program fixes X's wrong
first program than a fresh first program of X is right, as training logs it), `lift_over_writer`
(the same against a fresh first program of Y, Y's first programs in the pairs it starts), the repair
rate, and the first programs' accuracy; the lift over the writer also apart for the wrong first
programs that ran (`_ran`: the unit tests' feedback) and those that raised (`_error`). Every episode goes to `<out>/swap/<part>_seed<S>.jsonl`. Reading: RB's lift over its writer high and RR's about 0 says R forgot how to use
feedback (a KL to B on the later turns, or keeping B as the repairer, would help); RB's about 0 too
says the mistakes R still makes are not ones B's feedback reading fixes (RL moved the fixable ones
into the first program).
Labels are read to score the programs only, never shown. Figures go to `<out>/swap.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.repair import EVAL_CONFIG  # noqa: E402

PARTS = {"unseen": "shapes:val-unseen", "seen": "shapes:val-seen"}
NAMES = {"B": "before_rl", "R": "repair", "S": "single"}


class LabelledScorer:
    """The evaluation's scorer with each program's correctness added, so the episodes' turns know
    whether they are right (`Turn.right`); the feedback never shows it (`verdict` is not shown)."""

    def __init__(self, inner: Any):
        self.inner = inner

    def score(self, examples, programs):
        from vprl.rewards.correctness import correctness

        scored = self.inner.score(examples, programs)
        scored.rewards.components["correctness"] = [
            correctness(e, r.answer) if r.status == "ok" and r.answer is not None else 0.0
            for e, r in zip(examples, scored.results, strict=True)
        ]
        return scored


def play(session: Any, examples: list, first_by: Any, later_by: Any, repair: Any, samples: int, seed: int) -> list:
    """Episodes of two turns at most: first programs sampled from `first_by`, second ones from
    `later_by` (generators), each question `samples` times in a row (as a training batch holds them)."""
    from vprl.train.evaluation.repair_mode import EvalScorer
    from vprl.train.prompts import completion_to_program
    from vprl.train.prompts.conversation import RepairFormat, body_of, opener_of
    from vprl.train.repair.turns import EpisodeLoop

    ctx = session.context(seed)
    sampling = dataclasses.replace(ctx.sampling, n=1)
    rows = [e for e in examples for _ in range(samples)]
    prompts = [session.prompt(e) for e in rows]
    firsts = [completion_to_program(p, c[0]) for p, c in zip(prompts, first_by.generate(prompts, sampling))]
    fmt = RepairFormat(None, "plain")

    def next_programs(indices, feedbacks):
        openers = [opener_of(prompts[i]) for i in indices]
        texts = [
            prompts[i] + body_of(firsts[i]) + fmt.block_text(fb, op)
            for i, fb, op in zip(indices, feedbacks, openers, strict=True)
        ]
        return [completion_to_program(op, c[0]) for op, c in zip(openers, later_by.generate(texts, sampling))]

    scorer = LabelledScorer(EvalScorer(ctx, session.judge))
    return EpisodeLoop(scorer, repair).run(rows, firsts, next_programs)


def fresh_counts(played: dict[str, list]) -> dict[str, dict[str, tuple[int, int]]]:
    """Per policy, per question: (right, all) of the first programs it wrote, over the pairs it
    starts."""
    counts: dict[str, dict[str, list[bool]]] = {}
    for pair, episodes in played.items():
        for e in episodes:
            counts.setdefault(pair[0], {}).setdefault(e.example_id, []).append(e.first.right())
    return {k: {q: (sum(v), len(v)) for q, v in by_q.items()} for k, by_q in counts.items()}


def lift_over(
    pair: str, episodes: list, counts: dict[str, dict[str, tuple[int, int]]], ran: bool | None = None
) -> float | None:
    """How much more often the second program fixes a wrong first program than a fresh first program
    *of the second program's writer* is right on that question: resample_lift with the writer's own
    accuracy as the bar, so a weaker writer repairing a stronger policy's mistakes is not counted
    against its reading. Where the writer wrote the first program too, that (wrong) sample is left
    out of the bar, as in resample_lift. `ran`: only the wrong first programs that ran (and failed
    their unit tests: feedback from the tests and the trace) or only those that did not (an error and
    the trace). None where the writer started no pair here, or no such episode went on."""
    writer = counts.get(pair[1])
    if writer is None:
        return None
    own = pair[0] == pair[1]
    lifts = []
    for e in episodes:
        if len(e.turns) < 2 or e.first.right() or e.example_id not in writer:
            continue
        if ran is not None and (e.first.status == "ok") != ran:
            continue
        right, n = writer[e.example_id]
        if own and n < 2:
            continue
        lifts.append(float(e.turns[1].right()) - (right / (n - 1) if own else right / n))
    return sum(lifts) / len(lifts) if lifts else None


def play_seed(args: argparse.Namespace, seed: int, pairs: list[str]) -> dict[str, list]:
    """Every pair's episodes for one seed's policies, also written to `episode_log`."""
    import torch

    from bench.repair import eval_args
    from vprl.train.evaluation.pipeline import EvalConfig, prepare
    from vprl.train.evaluation.repair_mode import loop_plan
    from vprl.train.evaluation.session import EvalSession, policy_generator
    from vprl.train.recipe.parsing import parse_config

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    policy = out / f"policy_seed{seed}"
    adapters = {"R": out / f"seed{seed}" / "repair" / "adapter"}
    if "S" in "".join(pairs):
        adapters["S"] = Path(args.single_from) / f"seed{seed}" / "single" / "adapter"
    (cfg,) = parse_config(
        [EvalConfig],
        [
            "--config", str(EVAL_CONFIG),
            "--model_name_or_path", str(policy),
            "--base_label", NAMES["B"],
            "--adapters", ",".join(f"{NAMES[k]}={v}" for k, v in adapters.items()),
            "--shapes_root", str(out / "shapes_eval"),
            "--seen_from", str(policy / "world"),
            "--out", str(out / "swap" / f"seed{seed}"),
            "--threads", str(args.threads),
            *eval_args(argparse.Namespace(pass_threshold=args.pass_threshold, later_turns="sampled")).split(),
        ],
    )  # fmt: skip
    plan, data = prepare(cfg)
    (mode,) = [m for m in plan.modes if m.name == "repair"]
    repair = loop_plan(mode).repair
    examples = data[PARTS[args.part]]
    played: dict[str, list] = {}
    with EvalSession(cfg) as session:
        generators = {p.label: policy_generator(cfg, p) for p in plan.policies}
        session.generator = generators[NAMES["B"]]  # the context's; every pair names its own two
        for pair in pairs:
            first_by, later_by = (generators[NAMES[k]] for k in pair)
            played[pair] = play(session, examples, first_by, later_by, repair, args.samples, seed)
    log = episode_log(args, seed)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"pair": k, **e.to_json()}) + "\n" for k, eps in played.items() for e in eps)
    print(f"episodes: {log}")
    return played


def episode_log(args: argparse.Namespace, seed: int) -> Path:
    return Path(args.out) / "swap" / f"{args.part}_seed{seed}.jsonl"


def read_log(path: Path) -> dict[str, list]:
    """A call's episodes by pair, as it wrote them."""
    from vprl.train.repair.episode import Episode

    played: dict[str, list] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            row = json.loads(line)
            played.setdefault(row.pop("pair"), []).append(Episode.from_json(row, f"{path}:{n}"))
    return played


def figures_of(played: dict[str, list], seed: int) -> dict[str, dict[str, float | None]]:
    from vprl.train.repair.episode import episode_stats, resample_lift

    counts = fresh_counts(played)
    figures = {}
    for pair, episodes in played.items():
        stats = episode_stats(episodes)
        figures[pair] = {
            "resample_lift": resample_lift(episodes),
            "lift_over_writer": lift_over(pair, episodes, counts),
            "lift_over_writer_ran": lift_over(pair, episodes, counts, ran=True),
            "lift_over_writer_error": lift_over(pair, episodes, counts, ran=False),
            "repair_rate": stats.get("repair/repair_rate"),
            "first_right": stats["repair/first_right"],
            "final_right": stats["repair/final_right"],
            "second_turn_share": stats["repair/multi_turn_share"],
        }
        print(f"seed {seed} {pair}: " + ", ".join(f"{k} {v:.3f}" for k, v in figures[pair].items() if v is not None))
    return figures


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/br", help="a bench/repair.py folder (default: runs/br)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--samples", type=int, default=8, help="first programs per question (default: 8)")
    parser.add_argument("--pairs", default="BB,RR,RB,SB,SS", help="first-then-second policies (default: all five)")
    parser.add_argument("--single_from", default="runs/rc", help="the folder of the single arm's runs")
    parser.add_argument("--pass_threshold", type=float, default=0.5, help="the repair runs' training threshold")
    parser.add_argument(
        "--part",
        choices=tuple(PARTS),
        default="unseen",
        help="the questions: queries never trained on (default) or ones also asked in training, on new images",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--replay", action="store_true", help="the figures from the episodes an earlier call wrote, not played again"
    )
    parser.add_argument(
        "--collect", default="", help="comma list of swap_seed*.json files (one call per seed) to summarise together"
    )
    args = parser.parse_args(argv)
    pairs = [p.strip() for p in args.pairs.split(",") if p.strip()]
    if bad := [p for p in pairs if len(p) != 2 or set(p) - set(NAMES)]:
        parser.error(f"--pairs: {bad}: each is two of {''.join(NAMES)}")
    if args.collect:
        by_seed = {}
        for path in args.collect.split(","):
            by_seed.update({int(k): v for k, v in json.loads(Path(path).read_text())["by_seed"].items()})
    else:
        by_seed = {}
        for seed in (int(s) for s in args.seeds.split(",") if s.strip()):
            log = episode_log(args, seed)
            # --replay: the figures again from a call's episodes, without playing them
            played = read_log(log) if args.replay else play_seed(args, seed, pairs)
            by_seed[seed] = figures_of(played, seed)
    summary = {"samples": args.samples, "part": args.part, "by_seed": by_seed, "mean": {}}
    keys = list(next(iter(by_seed.values()))[pairs[0]])
    print(f"\nmean over seeds [lowest, highest seed]\n| pair | {' | '.join(keys)} |")
    for pair in pairs:
        cells, summary["mean"][pair] = [], {}
        for key in keys:
            # .get: a figure added since an older call's json was written
            values = [f[pair][key] for f in by_seed.values() if f[pair].get(key) is not None]
            mean = statistics.mean(values) if values else None
            summary["mean"][pair][key] = mean
            cells.append(f"{mean:+.3f} [{min(values):+.3f}, {max(values):+.3f}]" if values else "n/a")
        print(f"| {pair} | {' | '.join(cells)} |")
    path = Path(args.out) / (
        "swap.json" if args.collect else f"swap_{args.part}_seed{'_'.join(map(str, by_seed))}.json"
    )
    path.write_text(json.dumps(summary, indent=2))
    print(f"\nfigures: {path}")
    return summary


if __name__ == "__main__":
    main()
