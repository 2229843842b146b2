"""`python -m vprl.train.view PATH`: write the run viewer's page for a run or an evaluation folder."""

from __future__ import annotations

import sys
from pathlib import Path

from vprl.data.cli import CommandParser, checked, fail
from vprl.data.ranges import AT_LEAST_ONE
from vprl.train.view.page import ViewOptions, build_view


def parse_steps(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    first, sep, last = text.partition(":")
    try:
        low, high = (int(first), int(last)) if sep else (int(first), int(first))
    except ValueError:
        fail(f"--steps: expected FIRST:LAST or STEP (integers), got {text!r}")
    if low > high:
        fail(f"--steps: the first step {low} is after the last {high}")
    return low, high


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="python -m vprl.train.view",
        description="Write a static page (index.html, data.js, images/) showing what the programs of a run "
        "or an evaluation did: images with each tool call's boxes, programs, answers, rewards.",
    )
    parser.add_argument(
        "path", help="a run folder (rollouts.jsonl) or an evaluation output folder (predictions.jsonl)"
    )
    parser.add_argument("--out", help="folder to write the page into (default: PATH/view)")
    parser.add_argument(
        "--limit",
        type=int,
        default=400,
        value_range=AT_LEAST_ONE,
        help="groups of a run, or questions of an evaluation, put on the page (default: 400)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the sample drawn when there are more (default: 0)"
    )
    parser.add_argument("--steps", metavar="FIRST:LAST", help="only groups of these steps (a run; both included)")
    parser.add_argument(
        "--thumb", type=int, default=384, value_range=AT_LEAST_ONE, help="longest side of the pictures in pixels"
    )
    parser.add_argument(
        "--dataset_root", help="where the run's dataset (or the evaluation's shapes world) is now, if it moved"
    )
    parser.add_argument(
        "--no_examples", action="store_true", help="do not load the examples: no pictures, no gold (faster)"
    )
    parser.add_argument("--before", help="an evaluation's policy shown on the left (default: its first)")
    parser.add_argument("--after", help="an evaluation's policy shown on the right (default: its second)")
    args = parser.parse_args(argv)
    options = ViewOptions(
        out=Path(args.out) if args.out else None,
        limit=args.limit,
        seed=args.seed,
        steps=parse_steps(args.steps),
        thumb=args.thumb,
        dataset_root=args.dataset_root,
        use_examples=not args.no_examples,
        before=args.before,
        after=args.after,
    )
    result = checked(build_view, args.path, options)
    print(result["shown"])
    print(
        f"view: {result['page']} ({result['cards']:,} cards, {result['images']:,} pictures, "
        f"{result['bytes'] / 1e6:.1f} MB, {result['seconds']:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
