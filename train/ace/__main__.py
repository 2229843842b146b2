"""Automatically generated in-context examples (ACEs, Stanić et al.): good programs become prompt examples.

Two sources, one output (a JSONL of `{query, program, ...provenance}` that `train.prompts` reads as
in-context examples, plus a markdown preview next to it):

    python -m train.ace from-run --run RUN --k K --out ACES.jsonl
        the best-rewarded program of each example in a run's rollouts log, diverse k
        (`train.ace.from_run`).
    python -m train.ace stanic --config CFG.yaml [--k K --out ACES.jsonl ...]
        Stanić et al.'s procedure: the policy zero-shot on a small labelled set, optionally retried
        after an execution failure, scored, the top k kept (`train.ace.stanic`).

Asking for more ACEs than there are distinct good programs writes what there is and says so; a run
without a single good program (or without a rollouts log) is an error and writes nothing.
"""

from __future__ import annotations

import argparse
import sys

from train.ace.output import write_aces
from train.ace.records import AceError


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m train.ace", description=__doc__.split("\n\n")[0])
    sub = top.add_subparsers(dest="command", required=True)
    from_run = sub.add_parser("from-run", help="mine a run's rollouts log")
    from_run.add_argument("--run", required=True, help="run folder written by train/rl.py")
    from_run.add_argument("--k", type=int, default=16, help="how many ACEs")
    from_run.add_argument("--out", required=True, help="the ACE file to write (.jsonl)")
    sub.add_parser(
        "stanic",
        help="Stanić et al.'s zero-shot procedure",
        description="--config CFG.yaml plus --key value overrides: the policy, data, prompt and executor keys "
        "of train/rl.py's recipe and k, out, n, ids, seed, trials, retry, min_score, temperature, top_p, "
        "max_new_tokens, batch_size, rewards (train.ace.stanic.StanicArgs)",
    )
    return top


def main(argv: list[str] | None = None) -> int:
    args, rest = parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "stanic":
            from train.ace.stanic import stanic_from_config  # loads the policy stack

            report, out = stanic_from_config(rest)
        else:
            if rest:
                parser().error(f"unrecognized arguments: {' '.join(rest)}")
            from train.ace.from_run import aces_from_run

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
