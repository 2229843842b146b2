"""The evaluation's plots: the generalization matrix (policy, named by what it was trained on, ×
evaluation set; one panel per inference mode), per-question-type bars for each evaluation set, and
the breakdown of failures (execution errors and refusals). Fallback numbers sit in their own panels
("<mode>+fallback") of the matrix and are left out of the others.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vprl.train.evaluation.metrics import group_key
from vprl.train.evaluation.tables import (
    FALLBACK_SUFFIX,
    Results,
    datasets_of,
    first,
    matrix,
    metric_names,
    modes_of,
    pooled_groups,
)


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
    names = metric_names(results)
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
    """Horizontal bars per question type (group), one bar per policy, one panel per mode; the types
    with fewer than MIN_GROUP_N questions pooled into one bar (`tables.pooled_groups`)."""
    import numpy as np

    plt = _pyplot()
    modes = [m for m in modes_of(results) if not m.endswith(FALLBACK_SUFFIX)]
    policies = [p for p in results if any(dataset in results[p].get(m, {}) for m in modes)]
    bars: dict[tuple[str, str], dict[str, float]] = {}
    sizes: dict[str, int] = {}
    key = None
    for p in policies:
        for m in modes:
            if dataset in results[p].get(m, {}):
                metrics = first(results[p][m][dataset])
                key = key or group_key(metrics)
                if key is None:
                    continue
                pooled = pooled_groups(metrics.per_group, key)
                bars[p, m] = {label: value for label, value, _ in pooled}
                sizes.update({label: n for label, _, n in pooled})
    groups = list(sizes)
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
            per = bars.get((p, mode))
            if per is None:
                continue
            vals = [100 * per[g] if g in per else np.nan for g in groups]
            pos = y - 0.4 + bar * (i + 0.5)
            ax.barh(pos, vals, bar, label=p, color=f"C{i}")
            for yy, v in zip(pos, vals):  # the value at the bar's end, so that 0 is visible too
                if not np.isnan(v):
                    ax.text(min(v, 88.0) + 1, yy, f"{v:.0f}", va="center", fontsize=7)
        ax.set_yticks(y, [f"{g} (n={sizes[g]})" if sizes[g] else g for g in groups], fontsize=9)
        ax.set_xlim(0, 100)
        ax.set_xlabel(f"{key} (%)")
        ax.set_title(f"mode: {mode}", fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].invert_yaxis()  # the y axis is shared: inverting once puts the first group on top
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, title="policy", fontsize=9, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(f"{dataset}: {key} per question type (first seed)", fontsize=11, y=1.02)
    return _save(fig, path)


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
            for s in first(seeds).statuses
            if s != "ok"
        }
    )
    if any(
        first(seeds).rates.get("refusal_rate", 0)
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
                    m = first(by_mode[mode][ds])
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
