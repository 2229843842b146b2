"""Evaluation reports: one JSON with everything, a markdown table, and PNG plots.

Cells are mean ± std over seeds of each dataset's official metric (SugarCREPE, whose official
script reports its categories only, shows their mean, named as ours). The details list the official
numbers, then the other conventions under their own names, and the report ends with what each
name means and whose convention it is. Plots: the generalization matrix (policy, named by what it was
trained on, × evaluation set; one panel per inference mode), per-question-type bars for each
evaluation set, and the breakdown of failures (execution errors and refusals). Fallback numbers
sit in their own panels and tables ("<mode>+fallback"), never in the no-fallback ones.
Datasets keep the order the run listed them in.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from train.evaluation.metrics import DatasetMetrics, group_key, headline_key, headline_value

# results[policy][mode][dataset][seed] = metrics, plus the with-fallback twin when it was computed
Results = Mapping[str, Mapping[str, Mapping[str, Mapping[int, DatasetMetrics]]]]
FALLBACK_SUFFIX = "+fallback"


@dataclass(frozen=True)
class Cell:
    mean: float
    std: float
    n_seeds: int

    def text(self, scale: float = 100.0) -> str:
        if self.n_seeds > 1:
            return f"{scale * self.mean:.1f} ± {scale * self.std:.1f}"
        return f"{scale * self.mean:.1f}"


def cell(values: Sequence[float]) -> Cell:
    """Mean and sample standard deviation (n - 1) over seeds."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return Cell(mean, math.sqrt(var), len(values))


def _first(seeds: Mapping[int, DatasetMetrics]) -> DatasetMetrics:
    return seeds[min(seeds)]


def datasets_of(results: Results) -> list[str]:
    """Every dataset in first-seen order."""
    return list(dict.fromkeys(ds for by_mode in results.values() for by_ds in by_mode.values() for ds in by_ds))


def modes_of(results: Results) -> list[str]:
    return list(dict.fromkeys(mode for by_mode in results.values() for mode in by_mode))


def matrix(results: Results) -> dict[str, dict[str, dict[str, Cell]]]:
    """{policy: {mode: {dataset: Cell of the headline number}}}"""
    return {
        policy: {
            mode: {ds: cell([headline_value(m) for m in seeds.values()]) for ds, seeds in by_ds.items()}
            for mode, by_ds in by_mode.items()
        }
        for policy, by_mode in results.items()
    }


def _metric_names(results: Results) -> dict[str, str]:
    """dataset -> the name of its headline number."""
    names: dict[str, str] = {}
    for by_mode in results.values():
        for by_ds in by_mode.values():
            for ds, seeds in by_ds.items():
                names.setdefault(ds, headline_key(_first(seeds)))
    return names


def conventions(results: Results) -> dict[str, dict[str, str]]:
    """dataset -> each reported number's name -> what it is (official, or whose convention)."""
    out: dict[str, dict[str, str]] = {}
    for by_mode in results.values():
        for by_ds in by_mode.values():
            for ds, seeds in by_ds.items():
                m = _first(seeds)
                for name in [*m.headline, *m.variants]:
                    out.setdefault(ds, {}).setdefault(name, m.describe(name))
    return out


def to_json(results: Results, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "results": {},
        "matrix": {},
        "headline": _metric_names(results),
        "conventions": conventions(results),
    }
    for policy, by_mode in results.items():
        for mode, by_ds in by_mode.items():
            for ds, seeds in by_ds.items():
                out["results"].setdefault(policy, {}).setdefault(mode, {})[ds] = {
                    str(seed): m.to_json() for seed, m in seeds.items()
                }
    for policy, by_mode in matrix(results).items():
        for mode, by_ds in by_mode.items():
            out["matrix"].setdefault(policy, {})[mode] = {
                ds: {"mean": c.mean, "std": c.std, "seeds": c.n_seeds} for ds, c in by_ds.items()
            }
    if extra:
        out.update(extra)
    return out


def results_from_json(data: dict[str, Any]) -> dict[str, dict[str, dict[str, dict[int, DatasetMetrics]]]]:
    """The `results` of `to_json` (or of a whole evaluation.json) back as `DatasetMetrics`."""
    rows = data.get("results", data)
    return {
        policy: {
            mode: {
                ds: {int(seed): DatasetMetrics.from_json(m) for seed, m in seeds.items()}
                for ds, seeds in by_ds.items()
            }
            for mode, by_ds in by_mode.items()
        }
        for policy, by_mode in rows.items()
    }


def markdown(results: Results) -> str:
    """The matrix per mode (columns: evaluation sets with their metric), then each dataset's
    headline numbers and rates."""
    lines = ["# Evaluation", ""]
    mat = matrix(results)
    datasets = datasets_of(results)
    names = _metric_names(results)
    lines += ["Cells: the official metric in % (mean ± std over seeds where there are several).", ""]
    for mode in modes_of(results):
        header = [f"{ds} ({names[ds]})" for ds in datasets]
        lines += [f"## {mode}", "", "| policy | " + " | ".join(header) + " |", "|---|" + "---|" * len(datasets)]
        for policy, by_mode in mat.items():
            if mode in by_mode:
                row = [by_mode[mode][ds].text() if ds in by_mode[mode] else "–" for ds in datasets]
                lines.append(f"| {policy} | " + " | ".join(row) + " |")
        lines.append("")
    notes = conventions(results)
    ours = [ds for ds in datasets if names[ds] not in _official_names(results, ds)]
    lines += [f"{ds}: the cell is {names[ds]}, {notes[ds][names[ds]]}." for ds in ours]
    lines += [""] if ours else []
    lines += ["## Details (first seed)", "", "Official metrics first; then the other conventions, by name.", ""]
    for policy, by_mode in results.items():
        for mode, by_ds in by_mode.items():
            for ds in datasets:
                if ds not in by_ds:
                    continue
                m = _first(by_ds[ds])
                head = ", ".join(f"{k} {100 * v:.1f}{_counted(m, k)}" for k, v in m.headline.items())
                other = ", ".join(f"{k} {100 * v:.1f}{_counted(m, k)}" for k, v in m.variants.items())
                rates = ", ".join(f"{k} {v:.3g}" for k, v in m.rates.items())
                row = f"- **{policy} / {mode} / {ds}** (n={m.n}): official {head}"
                lines.append(row + (f"; variants {other}" if other else "") + f"; {rates}")
    lines += ["", "## What each number is", ""]
    for ds in datasets:
        lines += [f"- **{ds}**"] + [f"  - `{name}`: {text}" for name, text in notes.get(ds, {}).items()]
    return "\n".join(lines) + "\n"


def _official_names(results: Results, dataset: str) -> set[str]:
    return {
        name
        for by_mode in results.values()
        for by_ds in by_mode.values()
        if dataset in by_ds
        for name in _first(by_ds[dataset]).headline
    }


def _counted(m: DatasetMetrics, name: str) -> str:
    """` (of k)` where a number averages over fewer items than the dataset has (GQA's balanced ones)."""
    k = m.counted.get(name)
    return f" (of {k})" if k is not None and k != m.n else ""


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_matrix(results: Results, path: Path) -> Path:
    """One heatmap per mode: policies (rows) × evaluation sets (columns), headline metric in %."""
    import numpy as np

    plt = _pyplot()
    mat = matrix(results)
    datasets, modes, policies = datasets_of(results), modes_of(results), list(results)
    names = _metric_names(results)
    width = 2.2 + 1.45 * len(datasets)
    heights = [0.9 + 0.55 * len(policies) for _ in modes]
    fig, axes = plt.subplots(
        len(modes),
        1,
        figsize=(width, sum(heights) + 1.4),
        squeeze=False,
        sharex=True,
        gridspec_kw={"height_ratios": heights, "hspace": 0.35},
    )
    for ax, mode in zip(axes[:, 0], modes):
        grid = np.full((len(policies), len(datasets)), np.nan)
        for r, policy in enumerate(policies):
            for c, ds in enumerate(datasets):
                if ds in mat[policy].get(mode, {}):
                    grid[r, c] = 100 * mat[policy][mode][ds].mean
        im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=100, aspect="auto")
        for r, policy in enumerate(policies):
            for c, ds in enumerate(datasets):
                text = mat[policy][mode][ds].text() if not np.isnan(grid[r, c]) else "n/a"
                dark = np.isnan(grid[r, c]) or grid[r, c] < 60
                ax.text(c, r, text, ha="center", va="center", color="white" if dark else "black", fontsize=10)
        ax.set_yticks(range(len(policies)), policies, fontsize=10)
        ax.set_xticks(range(len(datasets)), [f"{ds}\n{names[ds]}" for ds in datasets], fontsize=9)
        ax.tick_params(axis="x", labelbottom=ax is axes[-1, 0])
        ax.set_title(f"mode: {mode}", fontsize=10, loc="left")
        ax.set_ylabel("policy")
    fig.suptitle("Generalization matrix: official metric (%) by policy × evaluation set", fontsize=11)
    fig.colorbar(im, ax=axes[:, 0].tolist(), fraction=0.025, pad=0.02, label="%")
    return _save(fig, path)


def plot_per_type(results: Results, dataset: str, path: Path) -> Path | None:
    """Horizontal bars per question type (group), one bar per policy, one panel per mode."""
    import numpy as np

    plt = _pyplot()
    modes = [m for m in modes_of(results) if not m.endswith(FALLBACK_SUFFIX)]
    policies = [p for p in results if any(dataset in results[p].get(m, {}) for m in modes)]
    groups: list[str] = []
    key = None
    for p in policies:
        for m in modes:
            if dataset in results[p].get(m, {}):
                first = _first(results[p][m][dataset])
                key = key or group_key(first)
                groups += [g for g in first.per_group if g not in groups and key in first.per_group[g]]
    if not groups or key is None:
        return None
    bar = 0.8 / len(policies)
    fig, axes = plt.subplots(
        1,
        len(modes),
        figsize=(2.5 + 4.2 * len(modes), 1.6 + 0.32 * len(groups) * max(len(policies), 2)),
        squeeze=False,
        sharey=True,
    )
    y = np.arange(len(groups))
    for ax, mode in zip(axes[0], modes):
        for i, p in enumerate(policies):
            seeds = results[p].get(mode, {}).get(dataset)
            if not seeds:
                continue
            per = _first(seeds).per_group
            vals = [100 * per[g][key] if g in per and key in per[g] else np.nan for g in groups]
            pos = y - 0.4 + bar * (i + 0.5)
            ax.barh(pos, vals, bar, label=p, color=f"C{i}")
            for yy, v in zip(pos, vals):  # the value at the bar's end, so that 0 is visible too
                if not np.isnan(v):
                    ax.text(min(v, 88.0) + 1, yy, f"{v:.0f}", va="center", fontsize=7)
        ax.set_yticks(y, [f"{g} (n={int(_group_n(results, dataset, g))})" for g in groups], fontsize=9)
        ax.set_xlim(0, 100)
        ax.set_xlabel(f"{key} (%)")
        ax.set_title(f"mode: {mode}", fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].invert_yaxis()  # the y axis is shared: inverting once puts the first group on top
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, title="policy", fontsize=9, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(f"{dataset}: {key} per question type (first seed)", fontsize=11, y=1.02)
    return _save(fig, path)


def _group_n(results: Results, dataset: str, group: str) -> float:
    for by_mode in results.values():
        for by_ds in by_mode.values():
            if dataset in by_ds:
                row = _first(by_ds[dataset]).per_group.get(group, {})
                if "n" in row:
                    return row["n"]
    return 0.0


def plot_errors(results: Results, path: Path) -> Path:
    """Failures of the answering program, % of questions: stacked execution errors (by status)
    plus refusals, one bar per policy × evaluation set, one panel per mode."""
    import numpy as np

    plt = _pyplot()
    modes = [m for m in modes_of(results) if not m.endswith(FALLBACK_SUFFIX)]
    datasets = datasets_of(results)
    kinds = sorted(
        {
            s
            for by_mode in results.values()
            for m in modes
            for seeds in by_mode.get(m, {}).values()
            for s in _first(seeds).statuses
            if s != "ok"
        }
    )
    if any(
        _first(seeds).rates.get("refusal_rate", 0)
        for by_mode in results.values()
        for m in modes
        for seeds in by_mode.get(m, {}).values()
    ):
        kinds.append("refused")
    bars_per_panel = len(results) * len(datasets)
    fig, axes = plt.subplots(
        len(modes), 1, figsize=(9.5, sum(1.2 + 0.3 * bars_per_panel for _ in modes) + 0.6), squeeze=False
    )
    colors = plt.get_cmap("tab10")
    for ax, mode in zip(axes[:, 0], modes):
        labels, rows = [], []
        for policy, by_mode in results.items():
            for ds in datasets:
                if ds in by_mode.get(mode, {}):
                    m = _first(by_mode[mode][ds])
                    labels.append(f"{policy} · {ds}")
                    rows.append(
                        [
                            100 * m.rates.get("refusal_rate", 0)
                            if k == "refused"
                            else 100 * m.statuses.get(k, 0) / m.n
                            for k in kinds
                        ]
                    )
        data = np.array(rows).reshape(len(rows), len(kinds))
        left = np.zeros(len(rows))
        for j, k in enumerate(kinds):
            ax.barh(range(len(rows)), data[:, j], left=left, label=k, color=colors(j % 10))
            left += data[:, j]
        for i, total in enumerate(left):
            ax.text(total + 0.5, i, f"{total:.0f}%", va="center", fontsize=8)
        ax.set_yticks(range(len(rows)), labels, fontsize=9)
        ax.invert_yaxis()
        ax.set_xlim(0, max(10.0, min(112.0, float(left.max()) * 1.15 + 2)))  # room for the labels
        ax.set_xlabel("% of questions")
        ax.set_title(f"mode: {mode}", fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
        if kinds:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.06, 1.0))
    fig.suptitle("Failures of the answering program: execution status and refusals (first seed)", fontsize=11)
    return _save(fig, path)


def plot_all(results: Results, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [plot_matrix(results, out_dir / "generalization_matrix.png")]
    for ds in datasets_of(results):
        path = plot_per_type(results, ds, out_dir / f"per_type_{_slug(ds)}.png")
        if path is not None:
            written.append(path)
    written.append(plot_errors(results, out_dir / "errors.png"))
    return written


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in text)


def _save(fig: Any, path: Path) -> Path:
    plt = _pyplot()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def write_reports(results: Results, out_dir: Path, extra: dict[str, Any] | None = None) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "evaluation.json", "markdown": out_dir / "evaluation.md"}
    paths["json"].write_text(json.dumps(to_json(results, extra), indent=1))
    paths["markdown"].write_text(markdown(results))
    for p in plot_all(results, out_dir / "plots"):
        paths[p.stem] = p
    return paths
