"""Automatically generated in-context examples (ACEs, Stanić et al.): good programs become prompt examples.

Two sources, one output (a JSONL of `{query, program, ...provenance}` that `vprl.train.prompts` reads as
in-context examples, plus a markdown preview next to it):

    python -m vprl.train.ace from-run --run RUN --k K --out ACES.jsonl
        the best-rewarded program of each example in a run's rollouts log, checked on visual unit
        tests (right for the right reason), diverse k (`vprl.train.ace.from_run`).
    python -m vprl.train.ace stanic --config CFG.yaml [--k K --out ACES.jsonl ...]
        Stanić et al.'s procedure: the policy zero-shot on a small labelled set, optionally retried
        after an execution failure, scored, the top k kept (`vprl.train.ace.stanic`).

Asking for more ACEs than there are distinct good programs writes what there is and says so; a run
without a single good program (or without a rollouts log) is an error and writes nothing.
"""

from __future__ import annotations

import argparse
import sys

from vprl.data.cli import CommandParser, fail
from vprl.data.ranges import AT_LEAST_ONE, FRACTION
from vprl.train.ace.output import write_aces
from vprl.train.ace.records import AceError
from vprl.train.recipe.parsing import ConfigError


def parser() -> argparse.ArgumentParser:
    top = CommandParser(prog="python -m vprl.train.ace", description=__doc__.split("\n\n")[0])
    sub = top.add_subparsers(dest="command", required=True, parser_class=CommandParser, metavar="{from-run,stanic}")
    from_run = sub.add_parser("from-run", help="mine a run's rollouts log", description="mine a run's rollouts log")
    from_run.add_argument("--run", required=True, help="run folder written by vprl/train/rl.py")
    from_run.add_argument("--k", type=int, default=16, value_range=AT_LEAST_ONE, help="how many ACEs (default: 16)")
    from_run.add_argument("--out", required=True, help="the ACE file to write (.jsonl; a .md preview goes beside it)")
    from_run.add_argument(
        "--unit_tests",
        default="auto",
        help="check candidates on visual unit tests and drop the right-for-the-wrong-reason ones: auto (the run's "
        "unit_tests reward, or the shapes world's rule-based writer), none, or a JSON mapping of unit_tests settings",
    )
    from_run.add_argument(
        "--min_unit_test_score",
        type=float,
        default=0.5,
        value_range=FRACTION,
        help="a candidate scoring below this on its unit tests is right for the wrong reason (default: 0.5)",
    )
    sub.add_parser(
        "stanic",
        help="Stanić et al.'s zero-shot procedure (--config configs/ace/stanic_shapes.yaml; stanic --help: its keys)",
        add_help=False,  # `stanic --help` is the help of its config keys, printed by the config parser
    )
    return top


def main(argv: list[str] | None = None) -> int:
    args, rest = parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "stanic":
            from vprl.train.ace.stanic import stanic_from_config  # loads the policy stack

            report, out = stanic_from_config(rest, prog="python -m vprl.train.ace stanic")
        else:
            if rest:
                parser().error(f"unrecognized arguments: {' '.join(rest)}")
            from vprl.train.ace.from_run import aces_from_run

            report, out = aces_from_run(args.run, args.k, None, args.unit_tests, args.min_unit_test_score), args.out
    except (AceError, ConfigError) as exc:  # bad input: the place and exit status 2
        fail(str(exc))
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
