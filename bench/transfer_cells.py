"""The transfer matrix's cells (`bench/transfer.py`): per-unit scores from an evaluation's
predictions, gains with intervals over seeds, the markdown table and the heat map.

A unit is what a dataset's headline counts, scored by `vprl.train.evaluation.official` on that unit
alone, so the mean over units is the headline: a balanced GQA-style question (exact string match),
a Winoground group (group score), a SugarCREPE entry (positive scored above negative; the headline
is the mean over categories, the same when categories hold as many entries, as the shapes world's
do), a RefCOCO referring expression (IoU >= 0.5)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vprl.data.loaders.gqa import is_balanced
from vprl.data.records import Example
from vprl.data.shapes.tasks import load_shapes_tasks
from vprl.train.evaluation import official
from vprl.train.evaluation.gains import PREDICTION_FIELDS, Gain, paired_gain
from vprl.train.evaluation.metrics import Prediction
from vprl.train.evaluation.seen import seen_queries, split_seen

DATASETS = (
    "shapes:val-unseen",
    "shapes:val-seen",
    "shapes:heldout-unseen",
    "shapes:heldout-seen",
    "shapes:winoground",
    "shapes:sugarcrepe",
    "shapes:refcoco",
)
SHORT = {
    "shapes:val-unseen": "train fam. unseen",
    "shapes:val-seen": "train fam. seen",
    "shapes:heldout-unseen": "held-out unseen",
    "shapes:heldout-seen": "held-out seen",
    "shapes:winoground": "Winoground group",
    "shapes:sugarcrepe": "SugarCREPE pair",
    "shapes:refcoco": "RefCOCO acc@0.5",
}
BEFORE = "before_rl"


def answers(predictions: str | Path, policy: str, dataset: str, mode: str = "single") -> dict[str, Any]:
    """The final answer (program alone) of each question of one policy and dataset, first seed."""
    out: dict[str, Any] = {}
    seed = None
    with open(predictions, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["policy"] != policy or row["mode"] != mode or row["dataset"] != dataset:
                continue
            seed = row["seed"] if seed is None else seed
            if row["seed"] == seed:
                out[row["example_id"]] = Prediction(**{k: row[k] for k in PREDICTION_FIELDS}).final_answer(False)
    return out


def unit_scores(dataset: str, examples: Sequence[Example], given: dict[str, Any]) -> dict[str, float]:
    missing = [e.id for e in examples if e.id not in given]
    if missing:
        raise ValueError(f"{dataset}: no prediction for {len(missing)} example(s), e.g. {missing[:3]}")
    if dataset == "shapes:winoground":
        groups = _by(examples, lambda e: str(e.meta["winoground_id"]))
        return {k: official.winoground(g, [given[e.id] for e in g]).headline["group"] for k, g in groups.items()}
    if dataset == "shapes:sugarcrepe":
        entries = _by(examples, lambda e: str(e.meta["entry"]))
        return {k: _only(official.sugarcrepe(g, [given[e.id] for e in g]).headline) for k, g in entries.items()}
    if dataset == "shapes:refcoco":
        return {e.id: official.grounding([e], [given[e.id]]).headline["acc50"] for e in examples}
    return {e.id: official.gqa([e], [given[e.id]]).headline["accuracy"] for e in examples if is_balanced(e)}


def _by(examples: Sequence[Example], key) -> dict[str, list[Example]]:
    out: dict[str, list[Example]] = defaultdict(list)
    for e in examples:
        out[key(e)].append(e)
    return out


def _only(values: dict[str, float]) -> float:
    (value,) = values.values()
    return value


def eval_examples(world: Path, seen_from: str) -> dict[str, list[Example]]:
    tasks = load_shapes_tasks(world, ["val", "heldout", "winoground", "sugarcrepe", "refcoco"])
    data = {f"shapes:{name}": exs for name, exs in tasks.items()}
    return split_seen(data, ["shapes:val", "shapes:heldout"], seen_queries(seen_from))


def summarize(arms: list[str], evaluations: list[dict], runs: list[dict], world: Path) -> dict:
    """Per arm and dataset: the gain over seeds with its interval, accuracy before and after, the
    exception rate before and after; per arm: the summed RL step time."""
    scores: dict[tuple[str, str], list[dict[str, float]]] = defaultdict(list)
    for ev in sorted(evaluations, key=lambda e: e["seed"]):
        data = eval_examples(world, ev["seen_from"])
        for name in DATASETS:
            if name not in data:
                continue
            for policy in (BEFORE, *arms):
                scores[policy, name].append(unit_scores(name, data[name], answers(ev["predictions"], policy, name)))
    names = [n for n in DATASETS if len(scores[BEFORE, n]) == len(evaluations)]
    summary: dict[str, Any] = {"seeds": sorted(e["seed"] for e in evaluations), "arms": arms, "datasets": names}
    summary["gains"] = {
        arm: {n: paired_gain(scores[BEFORE, n], scores[arm, n]).to_json() for n in names} for arm in arms
    }
    summary["accuracy"] = {
        policy: {n: statistics.mean(statistics.mean(s.values()) for s in scores[policy, n]) for n in names}
        for policy in (BEFORE, *arms)
    }
    summary["units"] = {n: [len(s) for s in scores[BEFORE, n]] for n in names}
    summary["exceptions"] = {
        policy: {
            n: statistics.mean(e["exceptions"][policy][n] for e in evaluations)
            for n in names
            if all(n in e["exceptions"][policy] for e in evaluations)
        }
        for policy in (BEFORE, *arms)
    }
    summary["step_seconds"] = {arm: [r["step_s"] for r in runs if r["arm"] == arm] for arm in arms}
    return summary


def markdown(summary: dict) -> str:
    names = summary["datasets"]
    lines = [
        f"seeds {summary['seeds']}, {summary['max_steps']} RL steps per arm; gain in points after - before: "
        "mean ± std over seeds [95 % interval, seeds then units]",
        "",
        "| arm | " + " | ".join(SHORT[n] for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for arm, gains in summary["gains"].items():
        cells = [Gain(**gains[n]).text() for n in names]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    acc = summary["accuracy"]
    lines += ["", "accuracy (%, mean over seeds), before RL and after each arm:", ""]
    lines += ["| policy | " + " | ".join(SHORT[n] for n in names) + " |", "|---|" + "---|" * len(names)]
    lines += [f"| {p} | " + " | ".join(f"{100 * acc[p][n]:.1f}" for n in names) + " |" for p in acc]
    exc = summary["exceptions"]
    lines += ["", "exception rate (%, mean over seeds):", ""]
    lines += ["| policy | " + " | ".join(SHORT[n] for n in names) + " |", "|---|" + "---|" * len(names)]
    lines += [f"| {p} | " + " | ".join(f"{100 * exc[p].get(n, float('nan')):.0f}" for n in names) + " |" for p in exc]
    units = ", ".join(f"{SHORT[n]} {'/'.join(map(str, u))}" for n, u in summary["units"].items())
    lines += ["", f"units per seed: {units}"]
    times = ", ".join(f"{a} {statistics.mean(t):.0f} s" for a, t in summary["step_seconds"].items() if t)
    lines.append(f"RL time (summed step times, mean over seeds): {times}")
    return "\n".join(lines)


def heat_map(summary: dict, path: Path) -> Path:
    """Arms x datasets, coloured by the mean gain; each cell shows it with its 95 % interval, in bold
    where the interval excludes zero."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    arms, names = list(summary["gains"]), summary["datasets"]
    gains = [[summary["gains"][a][n] for n in names] for a in arms]
    mean = np.array([[100 * g["mean"] for g in row] for row in gains])
    limit = max(float(np.abs(mean).max()), 1.0)
    fig, ax = plt.subplots(figsize=(1.7 * len(names) + 2.5, 0.9 * len(arms) + 1.8))
    image = ax.imshow(mean, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
    for i, row in enumerate(gains):
        for j, g in enumerate(row):
            sure = g["low"] > 0 or g["high"] < 0
            text = f"{100 * g['mean']:+.1f}\n[{100 * g['low']:+.1f}, {100 * g['high']:+.1f}]"
            ax.text(j, i, text, ha="center", va="center", fontsize=8, fontweight="bold" if sure else "normal")
    ax.set_xticks(range(len(names)), [SHORT[n] for n in names], rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(arms)), arms, fontsize=9)
    ax.set_title(
        f"gain after RL (points), {len(summary['seeds'])} seed(s), 95 % intervals; bold: excludes 0", fontsize=9
    )
    fig.colorbar(image, ax=ax, shrink=0.8, label="points")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
