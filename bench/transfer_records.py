"""What earlier `bench/transfer.py` calls recorded: `runs.jsonl` (one line per finished RL run) and
`evaluations.jsonl` (one per seed's evaluation). Both the matrix's own pass (`bench/transfer.py`) and
the job planner (`bench/transfer_jobs.py`) read them, so they live here, below both."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.learning import settings_of
from bench.transfer_args import EVAL_CONFIG
from vprl.data.cli import fail


def read_jsonl(path: Path) -> list[dict]:
    """The records of an earlier call; one that is not a JSON object ends the call naming its line
    (the file is the bench's own, but a hand edit or a full disk can break one)."""
    rows = []
    for i, line in enumerate(path.read_text().splitlines() if path.is_file() else [], 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            fail(f"{path}:{i}: not valid JSON ({exc.msg}); remove the line to run it again")
        if not isinstance(row, dict):
            fail(f"{path}:{i}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def recorded_evaluation(seed: int, arms: list[str], args: argparse.Namespace) -> dict | None:
    """The evaluation of these very runs (the seed's arms) under this evaluation config, if an
    earlier call made it."""
    same = {"seed": seed, "arms": sorted(arms), "runs": sorted(str(Path(args.out) / f"seed{seed}" / a) for a in arms)}
    wanted = settings_of(EVAL_CONFIG) + " " + args.eval_args
    found = [
        e
        for e in read_jsonl(Path(args.out) / "evaluations.jsonl")
        if all(e.get(k) == v for k, v in same.items()) and e["eval_config"] == wanted
    ]
    return found[-1] if found else None
