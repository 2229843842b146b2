"""`bench/repair.py`'s command line: its options, and the check of `--arms`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

BOOTSTRAP_EPOCHS = 3.0  # the bootstrap's passes over its mixture when the bench does not say


def parse_args(argv: list[str] | None, arms: Sequence[str], description: str) -> argparse.Namespace:
    """The options; `seeds` and `arms` come back as lists, an unknown arm refused naming the valid ones."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seeds", default="0,1,2", help="comma list of seeds (default: 0,1,2)")
    parser.add_argument("--max_steps", type=int, default=250, help="RL steps of every run (default: 250)")
    parser.add_argument("--out", default="runs/repair", help="folder of the policies, runs and figures")
    parser.add_argument("--arms", default=",".join(arms), help=f"comma list of {', '.join(arms)}")
    parser.add_argument(
        "--repair_share",
        type=float,
        default=0.3,
        help="the bootstrap's share of repair examples (default: 0.3; the 60-step run of 3 seeds had 0.1)",
    )
    parser.add_argument(
        "--repair_noun_share",
        type=float,
        default=0.4,
        help="the share of those whose wrong program names another shape (default: 0.4, docs/repair.md; "
        "the 60-step run of 3 seeds had 0)",
    )
    parser.add_argument(
        "--bootstrap_epochs",
        type=float,
        default=BOOTSTRAP_EPOCHS,
        help="the bootstrap's passes over its mixture, repair examples included (default: 3)",
    )
    parser.add_argument(
        "--relabel_share",
        type=float,
        default=0.0,
        help="the bootstrap's share of question pairs with shape and colour words permuted in question and program "
        "(default: 0)",
    )
    parser.add_argument(
        "--noun_weight",
        type=float,
        default=1.0,
        help="the bootstrap's loss weight of its programs' shape and colour words (default: 1)",
    )
    parser.add_argument(
        "--feedback",
        default="error,trace,unit_tests",
        help="comma list of what the feedback shows, in the bootstrap's repair examples, the repair arms' episodes "
        "and the evaluation's repair modes (vprl.rewards.feedback.PARTS, no verdict; default: error,trace,unit_tests)",
    )
    parser.add_argument(
        "--pass_threshold",
        type=float,
        default=0.5,
        help="the unit-test score at which a repair run's episode ends (default: 0.5; docs/repair.md's pilots)",
    )
    parser.add_argument(
        "--repeat_cost",
        type=float,
        default=0.0,
        help="the repair arms' repair_repeat_cost: reward lost per later program repeating an earlier one (default: 0)",
    )
    parser.add_argument(
        "--branches",
        type=int,
        default=1,
        help="the repair arms' repair_branches: rows of a group sharing one first program (default: 1)",
    )
    parser.add_argument(
        "--guide_weight",
        type=float,
        default=0.0,
        help="the labelled repair arm's repair_guide_weight: SFT on the batch's wrong first programs followed by a "
        "right program of their question (default: 0)",
    )
    parser.add_argument(
        "--turn_advantage",
        type=float,
        default=0.0,
        help="the repair arms' repair_turn_advantage: weight of the second programs' contrast within their block "
        "(needs --branches 2 or more; default: 0)",
    )
    parser.add_argument(
        "--first_credit",
        choices=("episode", "own", "both", "none"),
        default="episode",
        help="the repair arms' repair_first_credit: what the first program's tokens carry (default: episode)",
    )
    parser.add_argument(
        "--first_weight",
        type=float,
        default=1.0,
        help="the repair arms' repair_first_weight: what multiplies the first program's advantage (default: 1)",
    )
    parser.add_argument(
        "--later_credit",
        choices=("episode", "fresh"),
        default="episode",
        help="the repair arms' repair_later_credit: what the later programs' tokens carry (default: episode)",
    )
    parser.add_argument(
        "--replay_weight",
        type=float,
        default=0.0,
        help="the repair arms' repair_replay_weight: SFT on the bootstrap's own repair pairs replayed beside RL "
        "(default: 0)",
    )
    parser.add_argument(
        "--later_turns",
        choices=("greedy", "sampled"),
        default="greedy",
        help="the evaluation's repair mode writes its later programs greedily or sampled as training does "
        "(default: greedy)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=2,
        help="torch CPU threads of the bootstrap and RL (default: 2; 1 to run one call per seed side by side)",
    )
    parser.add_argument(
        "--save_steps",
        type=int,
        default=10,
        help="RL checkpoint interval: an interrupted call resumes from the last checkpoint (default: 10)",
    )
    parser.add_argument(
        "--collect",
        default="",
        help="comma list of other --out folders (one call per seed, run side by side) whose records join this one's",
    )
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if [a for a in args.arms if a not in arms]:
        parser.error(f"--arms: unknown {[a for a in args.arms if a not in arms]}; valid: {list(arms)}")
    return args
