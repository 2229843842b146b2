"""Two calls of bench/repair.py on the same bootstraps, one with a setting (treated) and one
without (control), paired per seed and question: the difference of their repair arms after RL in
every evaluation mode, with 95 % intervals, and each call's repair rate and resample lift over
training. `--collect` compares the arms of one call; this compares one arm across two calls (the
control trained on the first call's bootstraps, its `policy_seed<S>` linked in). Prints figures;
asserts nothing.

    python bench/repair_paired.py runs/fl_s0,runs/fl_s1,runs/fl_s2 runs/fc_s0,runs/fc_s1,runs/fc_s2
        [--arm repair] [--json runs/fl_vs_fc.json]

Each argument is a comma list of `--out` folders (one per seed, or one collected folder); each
record is scored on its own folder's evaluation world (every call builds the same one). The two
policies before RL must score alike on every question: the check that the calls share their
bootstraps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.repair_report import MODES, curve_summary, lift_curve, print_figures, unseen_scores  # noqa: E402
from vprl.train.evaluation.gains import Gain, paired_gain  # noqa: E402


def arm_records(folders: str, arm: str) -> dict[int, tuple[dict, Path]]:
    """Per seed: the `arm` record of the folders' runs.jsonl files and the folder's evaluation world."""
    out: dict[int, tuple[dict, Path]] = {}
    for folder in [Path(f) for f in folders.split(",") if f.strip()]:
        runs = folder / "runs.jsonl"
        if not runs.is_file():
            raise SystemExit(f"repair_paired: {runs} does not exist")
        for n, line in enumerate(runs.read_text(encoding="utf-8").splitlines(), 1):
            record = json.loads(line)
            if record["arm"] != arm:
                continue
            if record["seed"] in out:
                raise SystemExit(f"repair_paired: {runs}:{n}: a second {arm} record of seed {record['seed']}")
            out[record["seed"]] = (record, folder / "shapes_eval")
    return out


def paired(treated: dict[int, tuple[dict, Path]], control: dict[int, tuple[dict, Path]]) -> dict:
    seeds = sorted(treated)
    if seeds != sorted(control) or not seeds:
        raise SystemExit(f"repair_paired: the treated call has seeds {seeds}, the control {sorted(control)}")

    def scores(side: dict, mode: str, policy: str) -> list[dict[str, float]]:
        return [unseen_scores(side[s][0], side[s][1], mode, policy) for s in seeds]

    for mode in MODES:
        if scores(treated, mode, "before_rl") != scores(control, mode, "before_rl"):
            raise SystemExit(f"repair_paired: the policies before RL differ in {mode}: not the same bootstraps")
    summary: dict = {"seeds": seeds, "treated − control": {}, "accuracy": {}, "repair_rate": {}, "resample_lift": {}}
    for mode in MODES:
        after = scores(treated, mode, "after_rl"), scores(control, mode, "after_rl")
        summary["treated − control"][mode] = paired_gain(after[1], after[0]).to_json()
        summary["accuracy"][mode] = {
            name: statistics.mean(statistics.mean(s.values()) for s in side) for name, side in zip(SIDES, after)
        }
    for name, side in zip(SIDES, (treated, control)):
        curves = [c for s in seeds if (c := side[s][0]["repair_curve"])]
        if curves:
            summary["repair_rate"][name] = curve_summary(curves)
        lifts = [c for s in seeds if (c := lift_curve(Path(side[s][0]["run_dir"])))]
        if lifts:
            summary["resample_lift"][name] = curve_summary(lifts)
    return summary


SIDES = ("treated", "control")


def markdown(summary: dict) -> str:
    lines = [f"seeds {summary['seeds']}; unseen training-family questions, after RL", ""]
    lines += ["| mode | treated | control | treated − control, points |", "|---|---|---|---|"]
    for mode, gain in summary["treated − control"].items():
        acc = summary["accuracy"][mode]
        lines.append(f"| {mode} | {100 * acc['treated']:.1f} | {100 * acc['control']:.1f} | {Gain(**gain).text()} |")
    for figure, unit, spec in (("repair_rate", "%", ".0f"), ("resample_lift", "points", "+.0f")):
        for name, curve in summary[figure].items():
            per = "; ".join(f"{100 * r['first']:{spec}} → {100 * r['last']:{spec}}" for r in curve["per_seed"])
            lines.append(f"\n{figure} of {name} ({unit}), first → last 20 steps per seed: {per}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("treated", help="comma list of the treated call's --out folders")
    parser.add_argument("control", help="comma list of the control call's --out folders")
    parser.add_argument("--arm", default="repair", help="the arm compared (default: repair)")
    parser.add_argument("--json", default="", help="also write the figures to this file")
    args = parser.parse_args(argv)
    summary = paired(arm_records(args.treated, args.arm), arm_records(args.control, args.arm))
    return print_figures(summary, markdown(summary), args.json)


if __name__ == "__main__":
    main()
