"""ACEs from a run: the best-rewarded program of each example in the rollouts log (ties: the latest
step), only programs that ran and earned a positive reward, de-duplicated by normalised AST and by
query, checked on visual unit tests so that programs right by accident are dropped
(`vprl.train.ace.reason_check`), then a diverse k (`vprl.train.ace.records.select_diverse`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vprl.executor.program import ENTRY, extract_program
from vprl.train.ace.reason_check import ReasonCheck, keep_right_for_right_reason, reason_check
from vprl.train.ace.records import Ace, AceError, AceReport, distinct, select_diverse
from vprl.train.rollouts.log import RolloutLog, RolloutRow
from vprl.train.runs.folder import RunFolderError, read_manifest


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


def aces_from_run(
    run: str | Path, k: int, embed: Callable | None = None, unit_tests: str = "auto", min_unit_test_score: float = 0.5
) -> AceReport:
    """`unit_tests`: the candidates' check on visual unit tests (`vprl.train.ace.reason_check`): "auto",
    "none" or a JSON mapping of `unit_tests` reward settings."""
    run = Path(run)
    if k < 1:
        raise AceError(f"k must be a positive integer, got {k}")
    log = RolloutLog.in_run(run)
    if not log.path.is_file():
        raise AceError(f"{log.path}: no rollouts log; is {run} a run folder written by vprl/train/rl.py?")
    rows = log.read()
    if not rows:
        raise AceError(f"{log.path}: the rollouts log is empty (the run logged no step); no ACE to export")
    notes = []
    try:
        manifest = read_manifest(run)
    except RunFolderError as exc:
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
    check: ReasonCheck = reason_check(unit_tests, manifest, min_unit_test_score)
    pool = distinct(candidates)
    counts["distinct"] = len(pool)
    pool, check_notes = keep_right_for_right_reason(pool, check, manifest, counts)
    notes += check_notes
    if not pool:
        raise AceError(
            f"{log.path}: every candidate program failed its visual unit tests ({check_notes[-1]}); no ACE to export"
        )
    families = sorted({r.group for r in rows if r.group})
    missing = sorted(set(families) - {a.group for a in pool})
    if missing:
        notes.append(f"families in the run without a good program: {', '.join(missing)}")
    return AceReport(select_diverse(pool, k, embed), k, "from-run", str(run), counts, families, notes)
