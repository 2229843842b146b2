"""bench/repair.py's figures from its records: unseen-question scores per arm, mode and policy,
the comparisons and gains with their intervals, the repair-rate summary and plot, and the markdown
the bench prints. Running the arms is bench/repair.py's job; this reads what it wrote."""

from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path
from typing import Any

from vprl.data.shapes.tasks import load_shapes_tasks
from vprl.train.evaluation.gains import Gain, paired_gain, question_scores, share_of_gain
from vprl.train.evaluation.repair_mode import chosen_turn
from vprl.train.evaluation.seen import seen_queries, split_seen
from vprl.train.repair.episode import Episode, Turn, resample_lift
from vprl.train.repair.log import EpisodeLog, episode_logs

UNSEEN = "shapes:val-unseen"
# `repair_best` is not a mode the evaluation runs: it is the `repair` mode's own episodes with the
# answer taken from the turn the unit tests score highest (`keep: best`) instead of the last one, the
# same programs and executions; best of 2 by unit tests chooses with the same judge.
MODES = ("single", "majority", "unit_test_select", "reprompt_tests", "repair", "repair_best")
KEPT_BEST = {"repair_best": "repair"}


def _executions(predictions: str, labels: dict[str, str]) -> dict[str, dict[str, float]]:
    """Mean program executions per unseen question (`attempts`) per policy and mode."""
    sums: dict[tuple[str, str], list[int]] = {}
    names = {label: name for name, label in labels.items()}
    with open(predictions, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["mode"] in names and row["dataset"] == UNSEEN:
                sums.setdefault((row["policy"], names[row["mode"]]), []).append(int(row.get("attempts") or 1))
    out: dict[str, dict[str, float]] = {}
    for (policy, mode), counts in sums.items():
        out.setdefault(policy, {})[mode] = statistics.mean(counts)
        for derived, source in KEPT_BEST.items():
            if mode == source:
                out[policy][derived] = out[policy][mode]
    return out


def unseen_scores(run: dict, eval_world: Path, mode: str, policy: str) -> dict[str, float]:
    tasks = load_shapes_tasks(eval_world, ["val"])
    data = split_seen({"shapes:val": tasks["val"]}, ["shapes:val"], seen_queries(run["seen_from"]))
    if mode in KEPT_BEST:
        return best_turn_scores(run["predictions"], data[UNSEEN], policy, run["labels"][KEPT_BEST[mode]])
    return question_scores(run["predictions"], data[UNSEEN], policy, run["labels"][mode], dataset=UNSEEN)


def best_turn_scores(predictions: str, examples: list, policy: str, label: str) -> dict[str, float]:
    """Per unseen question: the correctness of the answer of the turn `keep: best` chooses among a
    repair mode's recorded turns (the first seed the predictions hold)."""

    def kept_best(row: dict) -> Any:
        turns = tuple(Turn.from_json(t, f"{predictions}: {row['example_id']}") for t in row["turns"])
        turn = chosen_turn(Episode(row["example_id"], turns), "best")
        return turn.answer if turn.status == "ok" else None

    return question_scores(predictions, examples, policy, label, dataset=UNSEEN, answer_of=kept_best)


def summarize(runs: list[dict], eval_world: Path, arms: list[str]) -> dict:
    """The figures of `runs` (records of `arms`), on the unseen questions of `eval_world`."""
    by_arm = {arm: sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"]) for arm in arms}
    seeds = sorted({r["seed"] for r in runs})
    if any([r["seed"] for r in rs] != seeds for rs in by_arm.values() if rs):
        raise ValueError(
            f"every arm needs every seed {seeds}: { ({a: [r['seed'] for r in rs] for a, rs in by_arm.items()}) }"
        )

    def scores(arm: str, mode: str, policy: str = "after_rl") -> list[dict[str, float]]:
        return [unseen_scores(r, eval_world, mode, policy) for r in by_arm[arm]]

    summary: dict = {"seeds": seeds, "comparisons": {}, "gains": {}, "accuracy": {}, "executions": {}}
    if by_arm["repair"] and by_arm["single"]:
        repaired = scores("repair", "repair")
        for mode in ("unit_test_select", "majority", "reprompt_tests", "single"):
            summary["comparisons"][f"repair run, 2-turn repair − single run, {mode}"] = paired_gain(
                scores("single", mode), repaired
            ).to_json()
        summary["comparisons"]["repair run, 2-turn repair kept best by unit tests − single run, unit_test_select"] = (
            paired_gain(scores("single", "unit_test_select"), scores("repair", "repair_best")).to_json()
        )
        # The same mode and judge on both sides, the single run's second turn untrained by RL: what training
        # the repair adds over the re-prompting the bootstrap's repair examples already give.
        summary["comparisons"]["repair run, 2-turn repair kept best − single run, 2-turn repair kept best"] = (
            paired_gain(scores("single", "repair_best"), scores("repair", "repair_best")).to_json()
        )
    if by_arm["single"]:
        # The single run's policy in the repair mode, its second turn never trained by RL (the bootstrap's
        # repair examples alone): what trained repair has to beat besides best of 2.
        summary["comparisons"]["single run, 2-turn repair kept best by unit tests − single run, unit_test_select"] = (
            paired_gain(scores("single", "unit_test_select"), scores("single", "repair_best")).to_json()
        )
    if by_arm["repair_label_free"] and by_arm["single"]:
        for mode, name in (("repair", "2-turn repair"), ("repair_best", "2-turn repair kept best by unit tests")):
            summary["comparisons"][f"label-free repair run, {name} − single run, unit_test_select"] = paired_gain(
                scores("single", "unit_test_select"), scores("repair_label_free", mode)
            ).to_json()
    for arm, rs in by_arm.items():
        if not rs:
            continue
        own = "single" if arm == "single" else "repair"
        summary["gains"][arm] = paired_gain(scores(arm, own, "before_rl"), scores(arm, own)).to_json()
        summary["accuracy"][arm] = {
            mode: {
                policy: statistics.mean(statistics.mean(s.values()) for s in scores(arm, mode, policy))
                for policy in ("before_rl", "after_rl")
            }
            for mode in MODES
        }
        summary["executions"][arm] = {
            mode: statistics.mean(_executions(r["predictions"], r["labels"])["after_rl"][mode] for r in rs)
            for mode in MODES
        }
        curves = [r["repair_curve"] for r in rs if r["repair_curve"]]
        if curves:
            summary.setdefault("repair_rate", {})[arm] = curve_summary(curves)
        lifts = [c for r in rs if (c := lift_curve(Path(r["run_dir"])))]
        if lifts:
            summary.setdefault("resample_lift", {})[arm] = curve_summary(lifts)
    if by_arm["repair"] and by_arm["repair_label_free"]:
        labelled = (scores("repair", "repair", "before_rl"), scores("repair", "repair"))
        free = (scores("repair_label_free", "repair", "before_rl"), scores("repair_label_free", "repair"))
        summary["label_free_share"] = share_of_gain(labelled, free).to_json()
        summary["leaks"] = [p for r in by_arm["repair_label_free"] for p in (r["leaks"] or [])]
    return summary


@functools.cache  # the summary and the plot both read it, and a run's episode logs are large
def lift_curve(run_dir: Path) -> list[tuple[int, float]]:
    """`resample_lift` of each training step's episodes (the run's episodes.jsonl files): does the
    second program beat a fresh first program of its question? Computed from the episodes, so runs
    recorded before the trainer logged it have it too. Read once per call of the bench."""
    by_step = episodes_by_step(run_dir)
    return [(step, lift) for step in sorted(by_step) if (lift := resample_lift(by_step[step])) is not None]


def episodes_by_step(run_dir: Path) -> dict[int, list[Episode]]:
    """A run's training episodes (every process's episodes.jsonl) by the optimizer step they trained."""
    by_step: dict[int, list[Episode]] = {}
    for path in episode_logs(run_dir):
        for step, episode in EpisodeLog(path).read():
            by_step.setdefault(step, []).append(episode)
    return by_step


def print_figures(figures: dict, text: str, json_path: str = "") -> dict:
    """Print a bench's markdown and, where a path is given, write its figures there as JSON."""
    if json_path:
        Path(json_path).write_text(json.dumps(figures, indent=2))
    print(text)
    return figures


def curve_summary(curves: list[list[tuple[int, float]]], window: int = 20) -> dict:
    """Per seed: a per-step figure (the repair rate, the resample lift) over the first and the last
    `window` steps (mean), and the lowest mean of any `window` consecutive steps after the first
    window (a collapse shows there)."""
    rows = []
    for curve in curves:
        rates = [r for _, r in curve]
        means = [statistics.mean(rates[i : i + window]) for i in range(0, max(len(rates) - window + 1, 1))]
        rows.append({"first": means[0], "last": means[-1], "lowest_after_first": min(means[1:] or means)})
    return {"per_seed": rows, "last_mean": statistics.mean(r["last"] for r in rows)}


def plot(runs: list[dict], path: Path) -> None:
    """The repair rate per step and, beside it, the second program's lift over a fresh sample (10-step
    means), one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate_ax, lift_ax) = plt.subplots(1, 2, figsize=(11, 3.5))
    for r in runs:
        style = "-" if r["arm"] == "repair" else "--"
        for ax, curve in ((rate_ax, r["repair_curve"]), (lift_ax, lift_curve(Path(r["run_dir"])))):
            if not curve:
                continue
            steps, values = zip(*curve)
            smooth = [statistics.mean(values[max(0, i - 9) : i + 1]) for i in range(len(values))]
            ax.plot(steps, smooth, style, label=f"{r['arm']} seed {r['seed']}")
    rate_ax.set_ylabel("repair rate (10-step mean)")
    rate_ax.set_ylim(0, 1)
    lift_ax.set_ylabel("resample lift (10-step mean)")
    lift_ax.axhline(0, color="grey", linewidth=0.8)
    for ax in (rate_ax, lift_ax):
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(summary: dict) -> str:
    lines = [f"seeds {summary['seeds']}; points on unseen training-family questions: mean ± std [95 % interval]", ""]
    lines += ["| comparison | points |", "|---|---|"]
    lines += [f"| {name} | {Gain(**g).text()} |" for name, g in summary["comparisons"].items()]
    lines += [f"| {arm}: gain after RL (own mode) | {Gain(**g).text()} |" for arm, g in summary["gains"].items()]
    lines += ["", "| arm | " + " | ".join(MODES) + " |", "|---|" + "---|" * len(MODES)]
    for arm, by_mode in summary["accuracy"].items():
        cells = [
            f"{100 * v['before_rl']:.1f}→{100 * v['after_rl']:.1f} ({summary['executions'][arm][m]:.2f} runs)"
            for m, v in by_mode.items()
        ]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    for arm, rate in summary.get("repair_rate", {}).items():
        per = "; ".join(
            f"{100 * r['first']:.0f}→{100 * r['last']:.0f} % (lowest {100 * r['lowest_after_first']:.0f} %)"
            for r in rate["per_seed"]
        )
        lines.append(f"\nrepair rate of {arm}, first → last 20 steps per seed: {per}")
    for arm, lift in summary.get("resample_lift", {}).items():
        per = "; ".join(f"{100 * r['first']:+.0f} → {100 * r['last']:+.0f}" for r in lift["per_seed"])
        lines.append(
            f"\nsecond program's lift over a fresh first program of its question, {arm}, points, first → last "
            f"20 steps per seed: {per}"
        )
    if "label_free_share" in summary:
        s = summary["label_free_share"]
        lines.append(
            f"\nlabel-free repair gain as a share of the labelled one: {100 * s['mean']:.0f} % "
            f"[{100 * s['low']:.0f}, {100 * s['high']:.0f}]; files holding the sentinel: {len(summary['leaks'])}"
        )
    return "\n".join(lines)
