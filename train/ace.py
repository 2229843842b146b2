"""Automatically generated in-context examples (ACEs, Stanić et al.): good programs become prompt examples.

Two sources, one output (a JSONL of `{query, program, ...provenance}` that `train.prompts` reads as
in-context examples, plus a markdown preview next to it):

    python -m train.ace from-run --run RUN --k K --out ACES.jsonl
        the best-rewarded program of each example in a run's rollouts log (ties: the latest step),
        only programs that ran and earned a positive reward, de-duplicated by normalised AST and by
        query, then a diverse k: one per question family, then one per unseen answer, then
        farthest-first in an embedding of query + program. The file's order is the pick order, so
        `max_ices: m` keeps the most diverse m.
    python -m train.ace stanic --config CFG.yaml [--k K --out ACES.jsonl ...]
        Stanić et al.'s procedure: the policy zero-shot on a small labelled set (`n` random examples
        or a list of `ids`), optionally retried after an execution failure (self-debugging re-prompt
        with the error, or resampling; label-free, as in the paper), scored (correctness / IoU),
        sorted by score, the top k with score >= min_score kept (train/ace_stanic.py).

Asking for more ACEs than there are distinct good programs writes what there is and says so; a run
without a single good program (or without a rollouts log) is an error and writes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executor.program import ENTRY, extract_program, program_key
from rewards.unit_tests.sampler import hashing_embedder
from train.prompts import IncontextExample, write_examples
from train.prompts.examples import comment, read_examples
from train.rollouts import RolloutLog, RolloutRow


class AceError(ValueError):
    pass


@dataclass(frozen=True)
class Ace:
    """One mined example with where it came from. `step` is the training step (from-run) or the
    trial that produced it (stanic, 0 = the zero-shot attempt)."""

    query: str
    program: str
    example_id: str
    score: float
    components: dict[str, float | None] = field(default_factory=dict)
    step: int | None = None
    group: str = ""
    answer: Any = None
    dataset: str = ""
    task: str = ""
    policy: str = ""
    prompt_hash: str = ""
    program_key: str = ""
    tool_stack: Any = None
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_example(self) -> IncontextExample:
        row = self.to_json()
        return IncontextExample(row.pop("query"), row.pop("program"), extra=row)

    @classmethod
    def from_row(cls, row: RolloutRow, program: str, source: str, policy: str = "", tool_stack: Any = None) -> Ace:
        return cls(
            query=row.query.strip(),
            program=program,
            example_id=row.example_id,
            score=float(row.total),
            components=dict(row.components),
            step=row.step,
            group=row.group,
            answer=row.answer,
            dataset=row.dataset,
            task=row.task,
            policy=row.policy or policy,
            prompt_hash=row.prompt_hash,
            program_key=program_key(program),
            tool_stack=tool_stack,
            source=source,
        )


@dataclass
class AceReport:
    """The picked ACEs and what the picking saw (for the preview and the CLI's messages)."""

    aces: list[Ace]
    k: int
    method: str
    source: str
    counts: dict[str, int]
    families_present: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def families_covered(self) -> list[str]:
        return sorted({a.group for a in self.aces if a.group})

    @property
    def shortfall(self) -> str | None:
        if len(self.aces) >= self.k:
            return None
        return (
            f"asked for {self.k} ACEs but only {len(self.aces)} distinct programs earned a good enough score "
            f"({self.counts.get('good', 0)} good programs over {self.counts.get('examples', 0)} examples); "
            f"wrote {len(self.aces)}"
        )


def _norm_query(query: str) -> str:
    return " ".join(query.casefold().split())


def _answer_key(answer: Any) -> str | None:
    """Answers that name a category (strings, yes/no, counts) take part in answer coverage; boxes do not."""
    if isinstance(answer, bool):
        return "yes" if answer else "no"
    if isinstance(answer, (str, int, float)):
        return _norm_query(str(answer))
    return None


def distinct(aces: Sequence[Ace]) -> list[Ace]:
    """The first of each normalised AST and of each query, in the given (best-first) order."""
    keys: set[str] = set()
    queries: set[str] = set()
    out = []
    for ace in aces:
        if ace.program_key in keys or _norm_query(ace.query) in queries:
            continue
        keys.add(ace.program_key)
        queries.add(_norm_query(ace.query))
        out.append(ace)
    return out


def select_diverse(pool: Sequence[Ace], k: int, embed: Callable[[Sequence[str]], Any] | None = None) -> list[Ace]:
    """k of `pool` (best first): one per family (largest families first), then one per unseen
    answer, then farthest-first by embedding of query + program (ViUniT's sampler, Alg. 1)."""
    import numpy as np

    if k <= 0 or not pool:
        return []
    chosen: list[int] = []
    families: dict[str, list[int]] = {}
    for i, ace in enumerate(pool):
        families.setdefault(ace.group, []).append(i)
    for family in sorted(families, key=lambda f: (-len(families[f]), f)):
        if len(chosen) < k:
            chosen.append(families[family][0])
    seen = {_answer_key(pool[i].answer) for i in chosen}
    for i, ace in enumerate(pool):
        key = _answer_key(ace.answer)
        if len(chosen) < k and i not in chosen and key is not None and key not in seen:
            seen.add(key)
            chosen.append(i)
    remaining = [i for i in range(len(pool)) if i not in chosen]
    if len(chosen) < k and remaining:
        vectors = (embed or hashing_embedder())([f"{a.query}\n{a.program}" for a in pool])
        while len(chosen) < k and remaining:
            dists = np.linalg.norm(vectors[remaining][:, None, :] - vectors[chosen][None, :, :], axis=-1).min(axis=1)
            chosen.append(remaining.pop(int(np.argmax(dists))))  # ties go to the better-ranked program
    return [pool[i] for i in chosen]


# --- from a run ------------------------------------------------------------------------------


def best_per_example(rows: Sequence[RolloutRow], source: str, policy: str = "", tool_stack: Any = None):
    """(the best good program of each example, best first; counts). Good: ran ("ok"), positive
    total, a whole `def execute_command` and a query. Best: highest total, then latest step, then
    latest row."""
    best: dict[str, tuple[tuple[float, int, int], RolloutRow, str]] = {}
    counts = {"rows": len(rows), "good": 0, "masked": 0}
    for index, row in enumerate(rows):
        if row.total is None:
            counts["masked"] += 1
            continue
        if row.status != "ok" or row.total <= 0:
            continue
        program = extract_program(row.program)
        if f"def {ENTRY}" not in program or not row.query.strip():  # an ACE needs both halves
            continue
        counts["good"] += 1
        rank = (row.total, row.step, index)
        if row.example_id not in best or rank > best[row.example_id][0]:
            best[row.example_id] = (rank, row, program)
    ordered = sorted(best.values(), key=lambda item: item[0], reverse=True)
    counts["examples"] = len(ordered)
    return [Ace.from_row(row, program, source, policy, tool_stack) for _, row, program in ordered], counts


def aces_from_run(run: str | Path, k: int, embed: Callable | None = None) -> AceReport:
    from train.export import ExportError, read_manifest

    run = Path(run)
    if k < 1:
        raise AceError(f"k must be a positive integer, got {k}")
    log = RolloutLog.in_run(run)
    if not log.path.is_file():
        raise AceError(f"{log.path}: no rollouts log; is {run} a run folder written by train/rl.py?")
    rows = log.read()
    if not rows:
        raise AceError(f"{log.path}: the rollouts log is empty (the run logged no step); no ACE to export")
    notes = []
    try:
        manifest = read_manifest(run)
    except ExportError as exc:
        manifest = {}
        notes.append(f"provenance without a manifest ({exc})")
    policy = manifest.get("policy") or {}
    policy_name = policy.get("name") or policy.get("base_model") or ""
    candidates, counts = best_per_example(rows, f"run:{run}", policy_name, manifest.get("tool_stack"))
    if not candidates:
        statuses = sorted({r.status for r in rows})
        raise AceError(
            f"{log.path}: none of its {len(rows)} programs ran and earned a positive reward (statuses: "
            f"{', '.join(statuses)}); no ACE to export"
        )
    pool = distinct(candidates)
    counts["distinct"] = len(pool)
    families = sorted({r.group for r in rows if r.group})
    missing = sorted(set(families) - {a.group for a in pool})
    if missing:
        notes.append(f"families in the run without a good program: {', '.join(missing)}")
    return AceReport(select_diverse(pool, k, embed), k, "from-run", str(run), counts, families, notes)


# --- output ----------------------------------------------------------------------------------


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
    """The ACE JSONL (read back through `train.prompts` to be sure it loads) and its preview."""
    out = Path(out)
    write_examples(out, [a.to_example() for a in report.aces])
    read_examples(out)
    preview = out.with_suffix(".md")
    preview.write_text(render_preview(report), encoding="utf-8")
    return out, preview


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["stanic"]:
        from train.ace_stanic import stanic_from_config  # imports train.ace; loads the policy stack

        try:
            report, out = stanic_from_config(argv[1:])
        except AceError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    else:
        parser = argparse.ArgumentParser(prog="python -m train.ace", description=__doc__.split("\n\n")[0])
        sub = parser.add_subparsers(dest="command", required=True)
        from_run = sub.add_parser("from-run", help="mine a run's rollouts log")
        from_run.add_argument("--run", required=True)
        from_run.add_argument("--k", type=int, default=16)
        from_run.add_argument("--out", required=True)
        sub.add_parser("stanic", help="Stanić et al.'s zero-shot procedure (--config CFG.yaml ...)")
        args = parser.parse_args(argv)
        try:
            report, out = aces_from_run(args.run, args.k), args.out
        except AceError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    if not report.aces:
        print(f"error: no ACE to write ({'; '.join(report.notes) or report.shortfall})", file=sys.stderr)
        return 1
    jsonl, preview = write_aces(report, out)
    for message in ([report.shortfall] if report.shortfall else []) + report.notes:
        print(f"warning: {message}", file=sys.stderr)
    print(f"wrote {len(report.aces)} ACEs to {jsonl} (preview: {preview})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
