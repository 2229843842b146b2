"""Does the learning hold up? The quickstart over several seeds, for the correctness reward and the
label-free unit-test reward with the same step budget. Prints figures; asserts nothing.

    python bench/learning.py [--seeds 0,1,2] [--max_steps 250] [--out runs/learning]
                             [--rewards correctness,unit_tests]

Per seed: the tiny policy bootstrapped with that seed (`vprl.train.bootstrap`, cached per seed), then per
reward the quickstart's RL and its evaluation before and after on the evaluation world (the
training families split into queries never trained on and queries that were, the held-out families,
image-text matching, grounding). Then, per reward and dataset:

- the gain (after − before, points) as mean ± std over seeds and a 95 % interval from a two-level
  bootstrap (seeds, then questions; `vprl.train.evaluation.gains`), without and with the fallback;
- the exception rate before and after;
- the label-free reward's gain as a share of the correctness reward's, same seeds and questions;
- RL time of the label-free reward over the correctness reward's, per seed: the summed per-step
  times of the two runs' metrics.jsonl (generation, execution, reward and update; a resumed run's
  steps count once). The unit-test cache is shared, so the first seed writes the tests and the
  later ones find most of them.

A record measured under another evaluation config (`configs/eval/shapes_matrix.yaml` changed) is
evaluated again from its adapter; RL is not repeated.

Figures go to `<out>/learning.json` and, as markdown, to the console.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vprl.data.shapes.tasks import load_shapes_tasks  # noqa: E402
from vprl.train.evaluation.gains import Gain, paired_gain, question_scores, share_of_gain  # noqa: E402
from vprl.train.evaluation.seen import seen_queries, split_seen  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECIPES = {
    "correctness": REPO / "configs/quickstart.yaml",
    "unit_tests": REPO / "configs/quickstart_label_free.yaml",
}
EVAL_CONFIG = REPO / "configs/eval/shapes_matrix.yaml"
VQA = ("shapes:val-unseen", "shapes:val-seen", "shapes:heldout")
OTHER = ("shapes:winoground", "shapes:sugarcrepe", "shapes:refcoco")


def run_seed(seed: int, reward: str, args: argparse.Namespace, variant: Variant | None = None) -> dict:
    """The quickstart for one seed and reward (or an ablation of its recipe); its evaluation
    report and timing."""
    from vprl.train.quickstart import main as quickstart

    out = Path(args.out)
    started = time.time()
    extra = ["--rl_args", variant.rl_args, "--run_name", f"{reward}_{variant.name}"] if variant else []
    report = quickstart(
        [
            "--seed", str(seed),
            "--model_name_or_path", str(out / f"policy_seed{seed}"),
            "--out", str(out / f"seed{seed}"),
            "--rl_config", str(RECIPES[reward]),
            "--max_steps", str(args.max_steps),
            "--eval_world", str(out / "shapes_eval"),
            *extra,
        ]
    )  # fmt: skip
    record = {
        "seed": seed,
        "reward": variant.label if variant else reward,
        "max_steps": args.max_steps,
        "timing": report["timing"],
        "run_dir": report["run_dir"],
        "recipe": stamp(reward, variant),
        "started": started,
        "seen_from": str(out / f"policy_seed{seed}" / "world"),
    }
    return _with_evaluation(record, report)


@dataclass(frozen=True)
class Variant:
    """An ablation: one reward's recipe with more vprl.train.rl arguments (`NAME=REWARD:ARGS`)."""

    name: str
    reward: str
    rl_args: str

    @property
    def label(self) -> str:
        return f"{self.reward}+{self.name}"

    @classmethod
    def parse(cls, text: str) -> Variant:
        name, sep, rest = text.partition("=")
        reward, sep2, rl_args = rest.partition(":")
        if not (sep and sep2 and name.isidentifier() and rl_args.strip()):
            raise ValueError(f"--variant {text!r}: expected NAME=REWARD:ARGS, e.g. kl=correctness:--beta 0.04")
        if reward not in RECIPES:
            raise ValueError(f"--variant {text!r}: unknown reward {reward!r}; valid: {list(RECIPES)}")
        return cls(name, reward, rl_args.strip())


def stamp(reward: str, variant: Variant | None = None) -> str:
    """What a run is stamped with: its recipe's settings and an ablation's arguments."""
    return settings_of(RECIPES[reward]) + (f" {variant.rl_args}" if variant else "")


def settings_of(path: Path) -> str:
    """A config's settings as canonical JSON: what a run is stamped with (comments do not count)."""
    return json.dumps(yaml.safe_load(path.read_text()), sort_keys=True)


def _with_evaluation(record: dict, report: dict) -> dict:
    """The record with the figures of one evaluation report, stamped with the evaluation config's
    content so that a record made under another evaluation is evaluated again."""
    modes = list(next(iter(report["results"].values())))
    return {
        **record,
        "eval_config": settings_of(EVAL_CONFIG),
        "mode": next(m for m in modes if not m.endswith("+fallback")),
        "predictions": str(report["paths"]["predictions"]),
        "headline": _headlines(report["results"]),
        "exceptions": _exceptions(report["results"]),
    }


def _stamp_of(label: str, variants: dict[str, Variant]) -> str:
    variant = variants.get(label)
    return stamp(variant.reward, variant) if variant else stamp(label)


def reevaluate(record: dict, args: argparse.Namespace) -> dict:
    """Evaluate a record's adapter again with today's evaluation config (RL is not repeated)."""
    from vprl.train.quickstart import QuickstartConfig, evaluate_before_after

    out = Path(args.out)
    policy = out / f"policy_seed{record['seed']}"
    run_dir = Path(record["run_dir"])
    cfg = QuickstartConfig(out=str(out / f"seed{record['seed']}"), eval_world=str(out / "shapes_eval"))
    started = time.time()
    report = evaluate_before_after(cfg, policy, run_dir / "adapter", run_dir.name)
    timing = {**record["timing"], "eval_s": time.time() - started}
    return _with_evaluation({**record, "run_dir": str(run_dir), "timing": timing}, report)


def step_seconds(run_dir: str) -> float:
    """Summed per-step wall time of an RL run from its metrics.jsonl (generation, execution, reward
    and update), robust to a run resumed from a checkpoint, unlike the wall clock around it."""
    total = 0.0
    with open(Path(run_dir) / "metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if "step_time" in row:
                total += float(row["step_time"])
    return total


def _headlines(results: dict) -> dict:
    from vprl.train.evaluation.metrics import headline_value

    return {
        policy: {
            mode: {ds: headline_value(seeds[min(seeds)]) for ds, seeds in by_ds.items()} for mode, by_ds in r.items()
        }
        for policy, r in results.items()
    }


def _exceptions(results: dict) -> dict:
    return {
        policy: {ds: seeds[min(seeds)].rates["exception_rate"] for ds, seeds in r[_plain_mode(r)].items()}
        for policy, r in results.items()
    }


def _plain_mode(by_mode: dict) -> str:
    return next(m for m in by_mode if not m.endswith("+fallback"))


def _mode(record: dict, which: str) -> str:
    plain = _plain_mode(record["headline"]["after_rl"])
    return plain + "+fallback" if which == "with fallback" else plain


def vqa_scores(run: dict, eval_world: Path, fallback: bool) -> dict[str, tuple[dict, dict]]:
    """Per VQA dataset: (before, after) per-question scores of one run."""
    tasks = load_shapes_tasks(eval_world, ["val", "heldout"])
    data = split_seen(
        {"shapes:val": tasks["val"], "shapes:heldout": tasks["heldout"]},
        ["shapes:val"],
        seen_queries(run["seen_from"]),
    )
    out = {}
    for name in VQA:
        if name not in data:
            continue
        before, after = (
            question_scores(
                run["predictions"], data[name], policy, run.get("mode", "single"), dataset=name, use_fallback=fallback
            )
            for policy in ("before_rl", "after_rl")
        )
        out[name] = (before, after)
    return out


def summarize(runs: list[dict], eval_world: Path) -> dict:
    rewards = list(dict.fromkeys(r["reward"] for r in runs))
    summary: dict = {
        "seeds": sorted({r["seed"] for r in runs}),
        "gains": {},
        "accuracy": {},
        "exceptions": {},
        "time": {},
    }
    scores = {}
    for reward in rewards:
        mine = sorted((r for r in runs if r["reward"] == reward), key=lambda r: r["seed"])
        for fallback in (False, True):
            per_run = [vqa_scores(r, eval_world, fallback) for r in mine]
            scores[reward, fallback] = per_run
            key = f"{reward}{'+fallback' if fallback else ''}"
            summary["gains"][key] = {
                name: paired_gain([p[name][0] for p in per_run], [p[name][1] for p in per_run]).to_json()
                for name in VQA
                if all(name in p for p in per_run)
            }
            for name in OTHER:
                mode = _plain_mode(mine[0]["headline"]["after_rl"]) + ("+fallback" if fallback else "")
                if not all(name in r["headline"]["after_rl"][mode] for r in mine):
                    continue
                gains = [r["headline"]["after_rl"][mode][name] - r["headline"]["before_rl"][mode][name] for r in mine]
                summary["gains"][key][name] = {
                    "mean": statistics.mean(gains),
                    "std": statistics.stdev(gains) if len(gains) > 1 else 0.0,
                    "seeds": len(gains),
                }
        summary["exceptions"][reward] = {
            name: {
                policy: statistics.mean(r["exceptions"][policy][name] for r in mine)
                for policy in ("before_rl", "after_rl")
            }
            for name in (*VQA, *OTHER)
            if all(name in r["exceptions"]["before_rl"] for r in mine)
        }
        summary["accuracy"][reward] = {
            f"{mode}": {
                name: {
                    policy: statistics.mean(r["headline"][policy][_mode(r, mode)][name] for r in mine)
                    for policy in ("before_rl", "after_rl")
                }
                for name in (*VQA, *OTHER)
                if all(name in r["headline"]["before_rl"][_mode(r, mode)] for r in mine)
            }
            for mode in ("programs", "with fallback")
        }
        summary["time"][reward] = [
            step_seconds(r["run_dir"]) if r.get("run_dir") else r["timing"]["rl_s"] for r in mine
        ]
    if "correctness" in rewards and "unit_tests" in rewards:
        ref, other = scores["correctness", False], scores["unit_tests", False]
        name = "shapes:val-unseen"
        summary["label_free_share"] = share_of_gain(
            ([p[name][0] for p in ref], [p[name][1] for p in ref]),
            ([p[name][0] for p in other], [p[name][1] for p in other]),
        ).to_json()
        summary["time_ratio"] = [u / c for u, c in zip(summary["time"]["unit_tests"], summary["time"]["correctness"])]
    return summary


def markdown(summary: dict) -> str:
    lines = [f"seeds {summary['seeds']}; gain in points: mean ± std over seeds [95 % interval]", ""]
    names = [*VQA, *OTHER]
    lines.append("| reward | " + " | ".join(names) + " |")
    lines.append("|---|" + "---|" * len(names))
    for key, gains in summary["gains"].items():
        cells = []
        for name in names:
            g = gains.get(name)
            if g is None:
                cells.append("")
            elif "low" in g:
                cells.append(Gain(**g).text())
            else:
                cells.append(f"{100 * g['mean']:+.1f} ± {100 * g['std']:.1f}")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines += ["", "accuracy before → after (%, mean over seeds):", ""]
    for reward, by_mode in summary["accuracy"].items():
        for mode, rates in by_mode.items():
            text = ", ".join(f"{n} {100 * r['before_rl']:.1f}→{100 * r['after_rl']:.1f}" for n, r in rates.items())
            lines.append(f"- {reward}, {mode}: {text}")
    lines += ["", "exception rate before → after (mean over seeds):", ""]
    for reward, rates in summary["exceptions"].items():
        text = ", ".join(f"{n} {100 * r['before_rl']:.0f}→{100 * r['after_rl']:.0f} %" for n, r in rates.items())
        lines.append(f"- {reward}: {text}")
    if "label_free_share" in summary:
        s = summary["label_free_share"]
        lines.append(
            f"\nlabel-free gain as a share of the correctness gain (unseen training-family queries): "
            f"{100 * s['mean']:.0f} % [{100 * s['low']:.0f}, {100 * s['high']:.0f}]"
        )
        ratios = ", ".join(f"{r:.2f}" for r in summary["time_ratio"])
        lines.append(f"RL step time, label-free over correctness, per seed: {ratios}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma list of seeds (default: 0,1,2)")
    parser.add_argument("--max_steps", type=int, default=250, help="RL steps for every reward (default: 250)")
    parser.add_argument("--out", default="runs/learning", help="folder of the policies, runs and figures")
    parser.add_argument("--rewards", default="correctness,unit_tests", help=f"comma list of {', '.join(RECIPES)}")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="an ablation NAME=REWARD:ARGS run beside the rewards, e.g. 'kl=correctness:--beta 0.04' (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        variants = {v.label: v for v in map(Variant.parse, args.variant)}
    except ValueError as err:
        parser.error(str(err))
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    rewards = [r.strip() for r in args.rewards.split(",") if r.strip()]
    unknown = [r for r in rewards if r not in RECIPES]
    if unknown:
        parser.error(f"--rewards: unknown {unknown}; valid: {list(RECIPES)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_file = out / "runs.jsonl"
    done = [json.loads(line) for line in runs_file.read_text().splitlines()] if runs_file.is_file() else []
    labels = [*rewards, *variants]
    runs = [r for r in done if r["seed"] in seeds and r["reward"] in labels and r["max_steps"] == args.max_steps]
    changed = [r for r in runs if r.get("recipe") != _stamp_of(r["reward"], variants)]
    for r in changed:  # trained with another version of its recipe: not comparable
        print(f"learning: seed {r['seed']} {r['reward']} was trained with another recipe; move {r['run_dir']} away")
    if changed:
        sys.exit("learning: runs trained with an older recipe would resume from their checkpoints; move them first")
    stale = [r for r in runs if r.get("eval_config") != settings_of(EVAL_CONFIG)]
    for record in stale:  # measured under another evaluation config: its adapter is evaluated again
        fresh = reevaluate(record, args)
        runs[runs.index(record)] = done[done.index(record)] = fresh
    if stale:
        runs_file.write_text("".join(json.dumps(r) + "\n" for r in done))
    for seed in seeds:
        for label in labels:
            if any(r["seed"] == seed and r["reward"] == label for r in runs):
                continue  # measured by an earlier, interrupted call: kept
            variant = variants.get(label)
            run = run_seed(seed, variant.reward if variant else label, args, variant)
            runs.append(run)
            with open(runs_file, "a", encoding="utf-8") as f:
                f.write(json.dumps(run) + "\n")
    summary = summarize(runs, out / "shapes_eval")
    summary["max_steps"] = args.max_steps
    (out / "learning.json").write_text(json.dumps(summary, indent=2))
    print("\n" + markdown(summary))
    return summary


if __name__ == "__main__":
    main()
