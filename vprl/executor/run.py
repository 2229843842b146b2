"""Run programs on examples in the sandbox and write one result row per program.

    python -m vprl.executor.run --examples EXAMPLES.jsonl --programs PROGRAMS.jsonl \\
        --tool_stack oracle --tool_overrides "{scene_graphs: val_sceneGraphs.json}" --out RESULTS.jsonl

Program rows are `{"id", "example_id", "program"}`; each result row is that `id` plus the fields of
`ExecutionResult`. A summary of statuses and tool-host metrics is printed at the end. The executor's
options are the RL recipe's executor keys (`vprl.executor.settings.ExecutorArgs`), under the same names.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any

from vprl.data.cli import CommandParser, checked, fail
from vprl.data.ranges import AT_LEAST_ONE, POSITIVE
from vprl.data.records import Example, read_examples, read_jsonl, write_jsonl
from vprl.data.typed import check_row
from vprl.executor.backends import open_backend
from vprl.executor.host import ToolHost
from vprl.executor.runner import SANDBOX_MODES, BatchRunner
from vprl.executor.sandbox.connection import SandboxUnavailable
from vprl.executor.serve.deploy import ServiceUnavailable
from vprl.executor.settings import ExecutorArgs
from vprl.executor.tools.base import ToolBackend
from vprl.executor.tools.images import ImageStore


def add_executor_options(p: CommandParser) -> None:
    """`ExecutorArgs`' keys as options, with its defaults and help."""
    defaults = {f.name: f for f in fields(ExecutorArgs)}

    def about(name: str) -> str:
        return defaults[name].metadata["help"]

    p.add_argument("--tool_stack", required=True, help=about("tool_stack"))
    p.add_argument("--tool_overrides", default=None, metavar="MAPPING", help=about("tool_overrides") + " (YAML)")
    p.add_argument("--tool_service", default=None, metavar="ADDRESS", help=about("tool_service"))
    p.add_argument("--executor_slots", type=int, default=None, value_range=AT_LEAST_ONE, help=about("executor_slots"))
    p.add_argument(
        "--executor_timeout_s", type=float, default=5.0, value_range=POSITIVE, help=about("executor_timeout_s")
    )
    p.add_argument("--executor_sandbox", choices=SANDBOX_MODES, default="auto", help=about("executor_sandbox"))
    p.add_argument(
        "--executor_max_rpcs", type=int, default=200, value_range=AT_LEAST_ONE, help=about("executor_max_rpcs")
    )


def executor_args(args: argparse.Namespace) -> ExecutorArgs:
    return ExecutorArgs(**{f.name: getattr(args, f.name) for f in fields(ExecutorArgs)})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(prog="python -m vprl.executor.run", description=__doc__.split("\n")[0])
    p.add_argument("--examples", required=True, help="JSONL of vprl.data.records.Example rows")
    p.add_argument("--programs", required=True, help='JSONL of {"id", "example_id", "program"} rows')
    p.add_argument("--out", required=True, help="where to write the result rows (JSONL)")
    add_executor_options(p)
    return p.parse_args(argv)


@dataclass(frozen=True)
class ProgramRow:
    """One row of a programs file: the program to run on an example, under an id of the caller's."""

    id: str | int
    example_id: str
    program: str


def read_programs(path: str, examples: dict[str, Example]) -> list[dict[str, Any]]:
    rows = []
    seen: set[str] = set()
    for lineno, row in read_jsonl(path):
        where = f"{path}:{lineno}"
        check_row(ProgramRow, row, where, required=("id", "example_id", "program"))
        if row["example_id"] not in examples:
            raise ValueError(f"{where}: example_id {row['example_id']!r} is not in the examples file")
        if str(row["id"]) in seen:
            raise ValueError(f"{where}: duplicate program id {row['id']!r}")
        seen.add(str(row["id"]))
        rows.append(row)
    return rows


def make_backend(tools: str, overrides: dict[str, Any], images: ImageStore, service: str | None = None) -> ToolBackend:
    # the oracle's scene graphs and a deployed stack's refusal of overrides are the door's rules
    return open_backend(tools, images, service, **overrides)


async def run(args: argparse.Namespace) -> Counter:
    # Everything a user supplied is read first: a bad file, row or setting ends here, in one line.
    examples = {ex.id: ex for ex in checked(read_examples, args.examples)}
    programs = checked(read_programs, args.programs, examples)
    executor = checked(executor_args, args)
    backend = checked(make_backend, executor.tool_stack, executor.tool_overrides, ImageStore(), executor.tool_service)
    host = ToolHost(backend)
    config = checked(executor.runner_config)
    try:
        async with BatchRunner(host, config) as runner:
            host.preload()  # models load before the first program, not inside its first call's timeout
            results = await runner.run(
                [(examples[row["example_id"]], row["program"]) for row in programs], progress=True, desc="executing"
            )
    finally:
        host.close()
    write_jsonl(args.out, ({"id": row["id"], **res.to_json()} for row, res in zip(programs, results)))
    statuses = Counter(r.status for r in results)
    print(f"wrote {len(results)} results to {args.out}")
    print("statuses: " + ", ".join(f"{s}={n}" for s, n in statuses.most_common()))
    print(time_summary(results))
    print("tool host: " + json.dumps(host.metrics(), default=str))
    return statuses


def time_summary(results) -> str:
    """Median time per program, and how much of it was spent waiting on the tool host."""
    if not results:
        return "time: no programs"
    durations = sorted(r.duration_s for r in results)
    waits = sorted(r.rpc_wait_s for r in results)
    total, waited = sum(durations), sum(waits)
    share = f" ({100 * waited / total:.0f}% of program time)" if total > 0 else ""
    return (
        f"time: median {1000 * durations[len(durations) // 2]:.1f} ms per program; "
        f"waiting on the tool host: median {1000 * waits[len(waits) // 2]:.1f} ms, total {waited:.2f} s{share}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        asyncio.run(run(args))
    except (SandboxUnavailable, ServiceUnavailable) as exc:
        fail(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
