"""Evaluation reports: one JSON with everything, a markdown report, tables (CSV, LaTeX) and plots.

Cells are mean ± std over seeds of each dataset's official metric (SugarCREPE, whose official
script reports its categories only, shows their mean, named as ours). The details list the official
numbers, then the other conventions under their own names. Fallback numbers sit in their own tables
("<mode>+fallback"), never in the no-fallback ones, each followed by the share of questions the
fallback answered and, where a "+fallback" cell falls between policies while that share falls, a
line saying so: the fallback answers fewer questions, and the programs now answering them do worse
than the tool did. The report ends with a glossary: what each mode did, what each number is and
whose convention it is, what each rate counts. Datasets keep the order the run listed them in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vprl.train.evaluation.conventions import NOTES, PREDICTION_FIELDS, RATES
from vprl.train.evaluation.metrics import DatasetMetrics
from vprl.train.evaluation.plots import plot_all
from vprl.train.evaluation.tables import (
    FALLBACK_SUFFIX,
    Cell,
    Results,
    cell,
    datasets_of,
    first,
    matrix,
    metric_names,
    modes_of,
    write_tables,
)

__all__ = ["FALLBACK_SUFFIX", "Cell", "cell", "markdown", "matrix", "results_from_json", "to_json", "write_reports"]

FALLBACK_EXPLAINED = (
    "A '+fallback' cell mixes two answerers: the end-to-end tool on the share of the questions above, the "
    "programs on the rest. A policy whose programs fail (or score low on their unit tests) less often hands "
    "fewer questions to the tool, so where the tool answers them better than its programs do, the "
    "'+fallback' cell falls while the programs alone improve."
)


def conventions(results: Results) -> dict[str, dict[str, str]]:
    """dataset -> each reported number's name -> what it is (official, or whose convention)."""
    out: dict[str, dict[str, str]] = {}
    for by_mode in results.values():
        for by_ds in by_mode.values():
            for ds, seeds in by_ds.items():
                m = first(seeds)
                for name in [*m.headline, *m.variants]:
                    out.setdefault(ds, {}).setdefault(name, m.describe(name))
    return out


def to_json(results: Results, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "results": {},
        "matrix": {},
        "headline": metric_names(results),
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


def markdown(results: Results, modes: Mapping[str, str] | None = None) -> str:
    """The matrix per mode (columns: evaluation sets with their metric), the fallback's share beside
    each "+fallback" table, each dataset's headline numbers and rates, then the glossary.
    `modes`: label -> what the mode did (`ModeConfig.description`); labels without one get a
    generic line."""
    lines = ["# Evaluation", ""]
    mat = matrix(results)
    datasets = datasets_of(results)
    names = metric_names(results)
    lines += ["Cells: the official metric in % (mean ± std over seeds where there are several).", ""]
    lines += ["Each mode, number and rate is explained in the glossary at the end.", ""]
    for mode in modes_of(results):
        lines += [f"## {mode}", ""] + _table(mat, mode, datasets, [f"{ds} ({names[ds]})" for ds in datasets])
        if mode.endswith(FALLBACK_SUFFIX):
            lines += _fallback_share(results, mode, datasets)
    notes = conventions(results)
    ours = [ds for ds in datasets if names[ds] not in _official_names(results, ds)]
    lines += [f"{ds}: the cell is {names[ds]}, {notes[ds][names[ds]]}." for ds in ours]
    noted = [(ds, NOTES[f]) for ds, f in _families(results).items() if f in NOTES]
    lines += [f"{ds}: {note}." for ds, note in noted]
    lines += [""] if ours or noted else []
    lines += ["## Details (first seed)", "", "Official metrics first; then the other conventions, by name.", ""]
    for policy, by_mode in results.items():
        for mode, by_ds in by_mode.items():
            for ds in datasets:
                if ds not in by_ds:
                    continue
                m = first(by_ds[ds])
                head = ", ".join(f"{k} {100 * v:.1f}{_counted(m, k)}" for k, v in m.headline.items())
                other = ", ".join(f"{k} {100 * v:.1f}{_counted(m, k)}" for k, v in m.variants.items())
                rates = ", ".join(f"{k} {v:.3g}" for k, v in m.rates.items())
                row = f"- **{policy} / {mode} / {ds}** (n={m.n}): official {head}"
                lines.append(row + (f"; variants {other}" if other else "") + f"; {rates}")
    return "\n".join(lines + ["", *glossary(results, modes)]) + "\n"


def _table(mat: dict[str, dict[str, dict[str, Cell]]], mode: str, datasets: list[str], header: list[str]) -> list[str]:
    lines = ["| policy | " + " | ".join(header) + " |", "|---|" + "---|" * len(datasets)]
    for policy, by_mode in mat.items():
        if mode in by_mode:
            row = [by_mode[mode][ds].text() if ds in by_mode[mode] else "–" for ds in datasets]
            lines.append(f"| {policy} | " + " | ".join(row) + " |")
    return lines + [""]


def _fallback_share(results: Results, mode: str, datasets: list[str]) -> list[str]:
    """The share of questions the fallback answered per policy, and a line for every cell that falls
    from the first policy's while that share falls too (means over seeds)."""
    mat = matrix(results)
    shares = {
        policy: {
            mode: {ds: cell([m.rates.get("fallback_rate", 0.0) for m in s.values()]) for ds, s in by[mode].items()}
        }
        for policy, by in results.items()
        if mode in by
    }
    lines = ["Share of the questions the fallback answered (%):", ""]
    lines += _table(shares, mode, datasets, datasets)
    lines.append(FALLBACK_EXPLAINED)
    plain = mode[: -len(FALLBACK_SUFFIX)]
    policies = list(shares)
    falls = []
    for ds in datasets:
        base = policies[0]
        for other in policies[1:]:
            if ds not in shares[base][mode] or ds not in shares[other][mode]:
                continue
            with_fb = [mat[p][mode][ds].mean for p in (base, other)]
            share = [shares[p][mode][ds].mean for p in (base, other)]
            if not (with_fb[1] < with_fb[0] and share[1] < share[0]):
                continue
            alone = [mat[p].get(plain, {}).get(ds) for p in (base, other)]
            text = f"- {ds}: {base} → {other} {_arrow(with_fb)} with the fallback, which answers {_arrow(share)} %"
            text += " of the questions" + (
                f"; the programs alone {_arrow([c.mean for c in alone])}" if all(alone) else ""
            )
            falls.append(text)
    if falls:
        lines += ["", "Where this happens in this report:", "", *falls]
    return lines + [""]


def _arrow(pair: list[float]) -> str:
    return f"{100 * pair[0]:.1f} → {100 * pair[1]:.1f}"


def _families(results: Results) -> dict[str, str]:
    """dataset -> the family that names its numbers (`DatasetMetrics.family`)."""
    return {
        ds: first(seeds).family
        for by_mode in results.values()
        for by_ds in by_mode.values()
        for ds, seeds in by_ds.items()
    }


def glossary(results: Results, modes: Mapping[str, str] | None = None) -> list[str]:
    """The report's last section: each mode of the report, each number, each rate it shows."""
    lines = ["## Glossary", "", "### Modes (the tables' titles)", ""]
    for label in modes_of(results):
        lines.append(f"- **{label}**: {(modes or {}).get(label) or _generic_mode(label)}")
    lines += ["", "### What each number is", ""]
    notes = conventions(results)
    for ds in datasets_of(results):
        lines += [f"- **{ds}**"] + [f"  - `{name}`: {text}" for name, text in notes.get(ds, {}).items()]
    lines += ["", "### Rates (in the details)", ""]
    shown = dict.fromkeys(
        k for by_mode in results.values() for by_ds in by_mode.values() for s in by_ds.values() for k in first(s).rates
    )
    lines += [f"- `{name}`: {RATES.get(name, 'a rate recorded by this run')}" for name in shown]
    lines += ["", "### predictions.jsonl", "", "One line per policy, mode, seed and question; beside what the mode"]
    lines += ["answered (answer, status, program, error, fallback_answer, unit_test_score):", ""]
    return lines + [f"- `{name}`: {text}" for name, text in PREDICTION_FIELDS.items()]


def _generic_mode(label: str) -> str:
    if label.endswith(FALLBACK_SUFFIX):
        return (
            f"the programs of '{label[: -len(FALLBACK_SUFFIX)]}', with the end-to-end tool's answer where the program "
            "failed to run (and, where the run set fallback_below, where it scored below it on its unit tests)"
        )
    return "the programs alone, no fallback (the run's settings are in evaluation.json's config)"


def _official_names(results: Results, dataset: str) -> set[str]:
    return {
        name
        for by_mode in results.values()
        for by_ds in by_mode.values()
        if dataset in by_ds
        for name in first(by_ds[dataset]).headline
    }


def _counted(m: DatasetMetrics, name: str) -> str:
    """` (of k)` where a number averages over fewer items than the dataset has (GQA's balanced ones)."""
    k = m.counted.get(name)
    return f" (of {k})" if k is not None and k != m.n else ""


def write_reports(
    results: Results, out_dir: Path, extra: dict[str, Any] | None = None, modes: Mapping[str, str] | None = None
) -> dict[str, Path]:
    """evaluation.json (with `modes`, each label's description), evaluation.md, the tables and plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "evaluation.json", "markdown": out_dir / "evaluation.md"}
    paths["json"].write_text(json.dumps(to_json(results, (extra or {}) | {"modes": dict(modes or {})}), indent=1))
    paths["markdown"].write_text(markdown(results, modes))
    paths.update(write_tables(results, out_dir))
    for path in plot_all(results, out_dir / "plots"):
        paths[path.stem] = path
    return paths
