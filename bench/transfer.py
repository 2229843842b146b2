"""The transfer matrix as one command: train on A, on A+B, on the mixture, and label-free on the
target; evaluate each on every task; a table and a heat map with intervals over seeds.

    python bench/transfer.py [--seeds 0,1,2] [--max_steps 250] [--out runs/transfer] [--arms a,b,...] [--jobs 2]

Per seed: the tiny policy bootstrapped with weak image-text matching and grounding programs besides
its VQA ones (`python -m vprl.train.bootstrap --tasks vqa itm grounding`, cached per seed); per arm, RL
from it with the arm's recipe on the seed's world (`vprl.train.rl`); then one evaluation of the policy
before RL and of every arm's adapter on a fresh world (seed 1001, no training seed's;
`configs/eval/transfer_matrix.yaml`): the training families and the held-out families, each split
into queries some arm trained on and queries none did, Winoground, SugarCREPE and RefCOCO. Arms:

    vqa              configs/quickstart.yaml                 A: the training families, correctness
    vqa_itm          configs/transfer/vqa_itm.yaml           A+B: and image-text matching, correctness
    mixture          configs/transfer/mixture.yaml           A, image-text matching and grounding
    adapt_itm        configs/transfer/adapt_itm.yaml         the captions alone, answers withheld, unit tests
    adapt_heldout    configs/transfer/adapt_heldout.yaml     the held-out families' questions, answers withheld
    adapt_itm_anchored  configs/transfer/adapt_itm_anchored.yaml  A with labels + captions without (opt-in)

A cell is the gain after - before in points, in the unit each dataset's headline counts (a question,
a Winoground group, a SugarCREPE entry, a referring expression at IoU >= 0.5): mean +- std over seeds
and a 95 % interval from the two-level bootstrap (seeds, then units; `vprl.train.evaluation.gains`).
Figures go to `<out>/transfer.json`, `<out>/transfer.md` and `<out>/transfer.png`; records of
finished runs to `<out>/runs.jsonl`, so an interrupted call resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.learning import settings_of, step_seconds  # noqa: E402
from bench.transfer_args import (  # noqa: E402
    ARMS,
    EVAL_CONFIG,
    eval_argv,
    parse_args,
    policy_config,
    rl_argv,
)
from bench.transfer_cells import heat_map, markdown, summarize  # noqa: E402
from bench.transfer_records import read_jsonl, recorded_evaluation  # noqa: E402
from vprl.data.cli import fail  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def policy_for(seed: int, args: argparse.Namespace) -> Path:
    from vprl.train.bootstrap.fit import ensure_tiny_policy

    return ensure_tiny_policy(policy_config(seed, args))


def eval_world(args: argparse.Namespace) -> Path:
    from vprl.data.shapes import BuildConfig, build_dataset

    root = Path(args.out) / "shapes_eval"
    wanted = args.eval_world_sizes
    manifest = root / "manifest.json"
    if not (
        manifest.is_file() and all(json.loads(manifest.read_text())["config"].get(k) == v for k, v in wanted.items())
    ):
        build_dataset(BuildConfig(out=str(root), train=10, **wanted))
    return root


def train_arm(seed: int, arm: str, policy: Path, args: argparse.Namespace) -> dict:
    from vprl.train.rl import main as rl_main

    run_dir = Path(args.out) / f"seed{seed}" / arm
    started = time.time()
    adapter = rl_main(rl_argv(seed, arm, policy, args))
    return {
        "seed": seed,
        "arm": arm,
        "max_steps": args.max_steps,
        "recipe": stamp(arm, args),
        "run_dir": str(run_dir),
        "adapter": str(adapter),
        "rl_s": time.time() - started,
        "step_s": step_seconds(str(run_dir)),
    }


def stamp(arm: str, args: argparse.Namespace) -> str:
    """What a run was made with: its recipe's settings, the extra vprl.train.rl arguments, the bootstrap's."""
    return f"{settings_of(ARMS[arm])} {args.rl_args} {args.arm_args.get(arm, '')} | {args.bootstrap}"


def seen_file(seed: int, policy: Path, args: argparse.Namespace) -> Path:
    """Every query of the seed's training world that some arm may train on, as label-free rows: the
    evaluation calls an evaluation query that is among them seen."""
    from vprl.data.records import write_jsonl
    from vprl.data.shapes.tasks import load_shapes_tasks
    from vprl.train.recipe.mixture import withhold_labels

    path = Path(args.out) / f"seed{seed}" / "seen_queries.jsonl"
    tasks = load_shapes_tasks(policy / "world", ["train", "heldout", "winoground", "sugarcrepe", "refcoco"])
    write_jsonl(path, [withhold_labels(ex) for exs in tasks.values() for ex in exs])
    return path


def evaluate_seed(seed: int, policy: Path, records: list[dict], args: argparse.Namespace) -> dict:
    """One evaluation of the policy before RL and every arm's adapter of this seed."""
    from vprl.train.evaluation.pipeline import EvalConfig, evaluate
    from vprl.train.recipe.parsing import parse_config

    out = Path(args.out) / f"seed{seed}" / "eval"
    adapters = ",".join(f"{r['arm']}={r['adapter']}" for r in records)
    seen = seen_file(seed, policy, args)
    argv = eval_argv(policy, adapters, eval_world(args), seen, out, args)
    started = time.time()
    report = evaluate(parse_config([EvalConfig], argv)[0])
    return {
        "seed": seed,
        "arms": sorted(r["arm"] for r in records),
        "eval_config": settings_of(EVAL_CONFIG) + " " + args.eval_args,
        "predictions": str(report["paths"]["predictions"]),
        "seen_from": str(seen),
        "runs": sorted(r["run_dir"] for r in records),
        "exceptions": {
            policy: {ds: seeds[min(seeds)].rates["exception_rate"] for ds, seeds in by_mode["single"].items()}
            for policy, by_mode in report["results"].items()
        },
        "eval_s": time.time() - started,
    }


def main(argv: list[str] | None = None) -> dict:
    args, seeds, arms = parse_args(argv, __doc__.split("\n\n")[0])
    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_file, evals_file = out / "runs.jsonl", out / "evaluations.jsonl"
    done = read_jsonl(runs_file)
    stale = [r for r in done if r["arm"] in arms and r["seed"] in seeds and r["recipe"] != stamp(r["arm"], args)]
    if stale:
        fail(f"{runs_file}: {[r['run_dir'] for r in stale]} were trained with another recipe; move them away first")
    if args.jobs > 1 and not args.stage:
        from bench.transfer_jobs import run_jobs

        eval_world(args)  # once, before evaluations build it side by side
        run_jobs(sys.argv[1:] if argv is None else argv, seeds, arms, args, trained=done)
        done = read_jsonl(runs_file)
    evaluations = []
    for seed in seeds:
        policy = policy_for(seed, args)
        if args.stage == "policy":
            return {}
        mine = {r["arm"]: r for r in done if r["seed"] == seed and r["max_steps"] == args.max_steps}
        for arm in arms:
            if arm not in mine:
                mine[arm] = train_arm(seed, arm, policy, args)
                with open(runs_file, "a", encoding="utf-8") as f:
                    f.write(json.dumps(mine[arm]) + "\n")
        if args.stage == "train":
            return {}
        records = [mine[a] for a in arms]
        found = recorded_evaluation(seed, arms, args)
        if found:
            evaluations.append(found)
            continue
        evaluation = evaluate_seed(seed, policy, records, args)
        with open(evals_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(evaluation) + "\n")
        evaluations.append(evaluation)
    if args.stage:
        return {}
    runs = [
        r
        for r in read_jsonl(runs_file)
        if r["seed"] in seeds and r["arm"] in arms and r["max_steps"] == args.max_steps
    ]
    summary = summarize(arms, evaluations, runs, eval_world(args))
    summary.update(max_steps=args.max_steps, bootstrap=args.bootstrap, rl_args=args.rl_args)
    (out / "transfer.json").write_text(json.dumps(summary, indent=2))
    table = markdown(summary)
    (out / "transfer.md").write_text(table + "\n")
    heat_map(summary, out / "transfer.png")
    print("\n" + table)
    print(f"\nfigures: {out / 'transfer.json'}, {out / 'transfer.md'}, {out / 'transfer.png'}")
    return summary


if __name__ == "__main__":
    main()
