"""Writing ACEs: the JSONL that `vprl.train.prompts` reads as in-context examples (pick order, so
`max_ices: m` keeps the most diverse m) and a markdown preview next to it."""

from __future__ import annotations

from pathlib import Path

from vprl.train.ace.records import AceReport
from vprl.train.prompts import write_examples
from vprl.train.prompts.examples import comment, read_examples


def render_preview(report: AceReport) -> str:
    c = report.counts
    lines = [
        f"# {len(report.aces)} ACEs ({report.method}, asked for {report.k})",
        "",
        f"Source: `{report.source}`. " + ", ".join(f"{k}: {v}" for k, v in c.items()) + ".",
        f"Families present: {', '.join(report.families_present) or '-'}; "
        f"covered: {', '.join(report.families_covered) or '-'}.",
    ]
    lines += [f"> {note}" for note in ([report.shortfall] if report.shortfall else []) + report.notes]
    lines += ["", "| # | family | query | answer | score | step | example |", "|---|---|---|---|---|---|---|"]
    for i, a in enumerate(report.aces, 1):
        query = a.query.replace("|", "\\|")
        lines.append(f"| {i} | {a.group} | {query} | {a.answer!s:.30} | {a.score:.3g} | {a.step} | {a.example_id} |")
    for i, a in enumerate(report.aces, 1):
        parts = ", ".join(f"{name} {value}" for name, value in a.components.items())
        lines += ["", f"## {i}. {a.query}", "", f"score {a.score:.3g} ({parts}); policy `{a.policy}`"]
        lines += ["```python", comment(a.query), a.program.rstrip("\n"), "```"]
    return "\n".join(lines) + "\n"


def write_aces(report: AceReport, out: str | Path) -> tuple[Path, Path]:
    """The ACE JSONL (read back through `vprl.train.prompts` to be sure it loads) and its preview."""
    out = Path(out)
    write_examples(out, [a.to_example() for a in report.aces])
    read_examples(out)
    preview = out.with_suffix(".md")
    preview.write_text(render_preview(report), encoding="utf-8")
    return out, preview
