"""The evaluation's numbers as tables: the matrix per mode, for the markdown report, a CSV and LaTeX.

- `evaluation.csv`: one row per policy × mode × dataset: the cell's metric, mean and std over seeds
  (in %), seeds, questions, and the rates a reader needs beside it (exceptions, the fallback's share);
- `per_type.csv`: one row per question type (family, tag, category) with its number of questions, every
  type included: the n column says how much a row weighs;
- `evaluation.tex`: one booktabs table per mode, the matrix as the markdown report shows it.

Per-type numbers drawn for reading (the plots, `pooled_groups`) pool the types with fewer than
`MIN_GROUP_N` questions into one row: below that, one question moves a type's number by more than
ten points, and a row of 0 or 100 from a single question reads as a finding.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vprl.train.evaluation.metrics import DatasetMetrics, group_key, headline_key, headline_value

# results[policy][mode][dataset][seed] = metrics, plus the with-fallback twin when it was computed
Results = Mapping[str, Mapping[str, Mapping[str, Mapping[int, DatasetMetrics]]]]
FALLBACK_SUFFIX = "+fallback"
MIN_GROUP_N = 10


@dataclass(frozen=True)
class Cell:
    mean: float
    std: float
    n_seeds: int

    def text(self, scale: float = 100.0, pm: str = " ± ") -> str:
        if self.n_seeds > 1:
            return f"{scale * self.mean:.1f}{pm}{scale * self.std:.1f}"
        return f"{scale * self.mean:.1f}"


def cell(values: Sequence[float]) -> Cell:
    """Mean and sample standard deviation (n - 1) over seeds."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return Cell(mean, math.sqrt(var), len(values))


def first(seeds: Mapping[int, DatasetMetrics]) -> DatasetMetrics:
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


def metric_names(results: Results) -> dict[str, str]:
    """dataset -> the name of its headline number."""
    names: dict[str, str] = {}
    for by_mode in results.values():
        for by_ds in by_mode.values():
            for ds, seeds in by_ds.items():
                names.setdefault(ds, headline_key(first(seeds)))
    return names


def rate(seeds: Mapping[int, DatasetMetrics], name: str) -> float:
    """A rate's mean over seeds (0 where it was not recorded)."""
    return sum(m.rates.get(name, 0.0) for m in seeds.values()) / len(seeds)


def pooled_groups(per_group: Mapping[str, Mapping[str, float]], key: str, min_n: int = MIN_GROUP_N):
    """[(label, value, n)] of the groups that have `key`, in order, with those of fewer than `min_n`
    questions pooled into one last row (their mean weighted by n, which is what the dataset's number
    over those questions would be). A group without "n" is kept as it is: its weight is unknown."""
    kept: list[tuple[str, float, int]] = []
    small: list[tuple[float, int]] = []
    for group, row in per_group.items():
        if key not in row:
            continue
        n = row.get("n")
        if n is not None and n < min_n:
            small.append((row[key], int(n)))
        else:
            kept.append((group, row[key], int(n) if n is not None else 0))
    if small:
        total = sum(n for _, n in small)
        value = sum(v * n for v, n in small) / total if total else 0.0
        kept.append((f"{len(small)} other types, under {min_n} questions each", value, total))
    return kept


def matrix_rows(results: Results) -> list[dict[str, Any]]:
    """The rows of `evaluation.csv`."""
    rows = []
    for policy, by_mode in results.items():
        for mode, by_ds in by_mode.items():
            for ds, seeds in by_ds.items():
                m = first(seeds)
                c = cell([headline_value(x) for x in seeds.values()])
                name = headline_key(m)
                rows.append(
                    {
                        "policy": policy,
                        "mode": mode,
                        "dataset": ds,
                        "metric": name,
                        "official": name in m.headline,
                        "mean_pct": round(100 * c.mean, 4),
                        "std_pct": round(100 * c.std, 4),
                        "seeds": c.n_seeds,
                        "questions": m.n,
                        "exception_pct": round(100 * rate(seeds, "exception_rate"), 4),
                        "fallback_pct": round(100 * rate(seeds, "fallback_rate"), 4),
                    }
                )
    return rows


def per_type_rows(results: Results) -> list[dict[str, Any]]:
    """The rows of `per_type.csv`: every question type of the first seed, with its n."""
    rows = []
    for policy, by_mode in results.items():
        for mode, by_ds in by_mode.items():
            for ds, seeds in by_ds.items():
                m = first(seeds)
                key = group_key(m)
                for group, row in m.per_group.items():
                    if key is not None and key in row:
                        rows.append(
                            {
                                "policy": policy,
                                "mode": mode,
                                "dataset": ds,
                                "type": group,
                                "metric": key,
                                "value_pct": round(100 * row[key], 4),
                                "questions": int(row["n"]) if "n" in row else "",
                            }
                        )
    return rows


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["policy"])
        writer.writeheader()
        writer.writerows(rows)
    return path


_LATEX = {c: "\\" + c for c in "&%$#_{}"} | {"\\": r"\textbackslash{}", "~": r"\textasciitilde{}", "^": r"\^{}"}


def tex(text: str) -> str:
    """Text as LaTeX typesets it literally (dataset names hold _ and :, labels +)."""
    return "".join(_LATEX.get(ch, ch) for ch in text)


def latex(results: Results) -> str:
    """One booktabs table per mode: policies × evaluation sets, the cell's number in %."""
    mat, datasets, names = matrix(results), datasets_of(results), metric_names(results)
    out = [
        "% The official metric in % (mean $\\pm$ std over seeds where there are several); needs \\usepackage{booktabs}.",
        "",
    ]
    for mode in modes_of(results):
        out += [
            "\\begin{table}[t]",
            "\\centering",
            f"\\caption{{Mode {tex(mode)}: each evaluation set's number (\\%) by policy.}}",
            "\\begin{tabular}{l" + "r" * len(datasets) + "}",
            "\\toprule",
            "policy & " + " & ".join(f"{tex(ds)} ({tex(names[ds])})" for ds in datasets) + " \\\\",
            "\\midrule",
        ]
        for policy, by_mode in mat.items():
            if mode in by_mode:
                row = [by_mode[mode][ds].text(pm=" $\\pm$ ") if ds in by_mode[mode] else "--" for ds in datasets]
                out.append(f"{tex(policy)} & " + " & ".join(row) + " \\\\")
        out += ["\\bottomrule", "\\end{tabular}", "\\end{table}", ""]
    return "\n".join(out)


def write_tables(results: Results, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": write_csv(matrix_rows(results), out_dir / "evaluation.csv"),
        "per_type_csv": write_csv(per_type_rows(results), out_dir / "per_type.csv"),
        "latex": out_dir / "evaluation.tex",
    }
    paths["latex"].write_text(latex(results), encoding="utf-8")
    return paths
