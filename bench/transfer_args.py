"""`bench/transfer.py`'s command line: its options, and every check of them made before any work.

A matrix call bootstraps a policy per seed (minutes) before its first RL run, and evaluates only
after every arm trained: an argument that RL or the evaluation would refuse must be refused here,
before a folder is made, as one line naming the option (`vprl.data.cli`), exit status 2. So the
extra arguments of each stage (`--bootstrap`, `--rl_args`, `--arm_args`, `--eval_args`) are parsed
here by that stage's own parser, with the very argument list the stage will get.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from pathlib import Path
from typing import Any

from vprl.data.cli import CommandParser, fail
from vprl.data.ranges import AT_LEAST_ONE

REPO = Path(__file__).resolve().parents[1]
ARMS = {
    "vqa": REPO / "configs/quickstart.yaml",
    "vqa_itm": REPO / "configs/transfer/vqa_itm.yaml",
    "mixture": REPO / "configs/transfer/mixture.yaml",
    "adapt_itm": REPO / "configs/transfer/adapt_itm.yaml",
    "adapt_heldout": REPO / "configs/transfer/adapt_heldout.yaml",
    "adapt_itm_anchored": REPO / "configs/transfer/adapt_itm_anchored.yaml",
}
DEFAULT_ARMS = "vqa,vqa_itm,mixture,adapt_itm,adapt_heldout"
STAGES = ("policy", "train", "eval")
EVAL_CONFIG = REPO / "configs/eval/transfer_matrix.yaml"
# The policy every arm starts from: weak on image-text matching and grounding as on its weak VQA
# families, with enough captions and referring expressions in its world to train on.
BOOTSTRAP = "--tasks vqa itm grounding --world_winoground 60 --world_sugarcrepe 15 --world_refcoco 100 --threads 1"
# The quickstart's sizes. Not its seed (1): a world's items are drawn per (seed, task, index), so the
# evaluation world of seed 1 would hold the very images, captions and held-out questions the policy
# of seed 1 was bootstrapped and adapted on.
EVAL_WORLD = {"seed": 1001, "val": 320, "winoground": 40, "sugarcrepe": 8, "refcoco": 50}
PROG = "bench/transfer.py"


def build_parser(description: str) -> CommandParser:
    parser = CommandParser(prog=PROG, description=description)
    parser.add_argument("--seeds", default="0,1,2", help="comma list of seeds (default: 0,1,2)")
    parser.add_argument(
        "--max_steps", type=int, default=250, value_range=AT_LEAST_ONE, help="RL steps of every arm (default: 250)"
    )
    parser.add_argument("--out", default="runs/transfer", help="folder of the policies, runs and figures")
    parser.add_argument("--arms", default=DEFAULT_ARMS, help=f"comma list of {', '.join(ARMS)}")
    parser.add_argument("--bootstrap", default=BOOTSTRAP, help="vprl.train.bootstrap arguments of every seed's policy")
    parser.add_argument("--rl_args", default="", help="more vprl.train.rl arguments for every arm")
    parser.add_argument(
        "--arm_args",
        action="append",
        default=[],
        help="more vprl.train.rl arguments for one arm, ARM=ARGS (repeatable), e.g. 'adapt_itm=--learning_rate 1e-3'",
    )
    parser.add_argument("--eval_args", default="", help="more vprl.train.evaluation arguments, e.g. '--limit 40'")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        value_range=AT_LEAST_ONE,
        help="torch CPU threads of RL (default 1: the tiny policy is fastest on one)",
    )
    parser.add_argument("--eval_world", default="", help='JSON sizes of the evaluation world, e.g. {"val": 40}')
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        value_range=AT_LEAST_ONE,
        help="bootstraps, RL runs and evaluations at once, each in its own process logging to <out>/logs "
        "(default 1; each takes one CPU core at --threads 1)",
    )
    parser.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)  # one job of a --jobs call
    return parser


def parse_args(argv: list[str] | None, description: str) -> tuple[argparse.Namespace, list[int], list[str]]:
    """`(args, seeds, arms)`, every argument checked; bad input ends the command (`fail`)."""
    parser = build_parser(description)
    args = parser.parse_args(argv)
    pairs = [text.partition("=") for text in args.arm_args]
    if any(not sep or name not in ARMS for name, sep, _ in pairs):
        fail(f"--arm_args: expected ARM=ARGS with ARM one of {list(ARMS)}, got {args.arm_args}")
    args.arm_args = {name: rest for name, _, rest in pairs}
    seeds = _seeds(args.seeds)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        fail(f"--arms: unknown {unknown}; valid: {list(ARMS)}")
    args.eval_world_sizes = eval_world_sizes(args.eval_world)
    if args.eval_world_sizes["seed"] in seeds:
        fail(
            f"--seeds: {args.eval_world_sizes['seed']} is the evaluation world's seed; "
            "its items would be the training world's"
        )
    _check_out(Path(args.out))
    for option in ("bootstrap", "rl_args", "eval_args", *(f"arm_args {a}" for a in args.arm_args)):
        text = getattr(args, option) if " " not in option else args.arm_args[option.split()[1]]
        try:
            shlex.split(text)
        except ValueError as exc:
            fail(f"--{option.split()[0]}: {text!r}: {exc}")
    if not args.stage:  # a job of a --jobs call: its parent checked these very arguments
        _check_stages(args, seeds, arms)
    return args, seeds, arms


def _seeds(text: str) -> list[int]:
    parts = [s.strip() for s in text.split(",") if s.strip()]
    try:
        seeds = [int(s) for s in parts]
    except ValueError:
        fail(f"--seeds: expected a comma list of integers, got {text!r}")
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        fail(f"--seeds: expected distinct non-negative integers, got {text!r}")
    return seeds


def eval_world_sizes(text: str) -> dict[str, Any]:
    """The evaluation world's `BuildConfig` settings: `EVAL_WORLD` with `--eval_world`'s JSON over it."""
    from vprl.data.shapes import BuildConfig
    from vprl.data.typed import check_row

    try:
        given = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        fail(f"--eval_world: not valid JSON ({exc.msg}, column {exc.colno}): {text!r}")
    if not isinstance(given, dict):
        fail(f'--eval_world: expected a JSON object of world sizes, e.g. {{"val": 40}}, got {text!r}')
    wanted = {**EVAL_WORLD, **given}
    try:
        check_row(BuildConfig, {"out": "-", **wanted}, "--eval_world")
        BuildConfig(out="-", train=10, **wanted)
    except (ValueError, TypeError) as exc:
        fail(f"--eval_world: {exc}" if not str(exc).startswith("--eval_world") else str(exc))
    return wanted


def _check_out(out: Path) -> None:
    """`--out` is a folder or can become one: its nearest existing ancestor a writable folder."""
    if out.exists():
        if not out.is_dir():
            fail(f"--out: {out} exists and is not a folder")
        if not os.access(out, os.W_OK | os.X_OK):
            fail(f"--out: {out} is not writable")
        return
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        fail(f"--out: {out} cannot be made: {parent} is not a writable folder")


def _check_stages(args: argparse.Namespace, seeds: list[int], arms: list[str]) -> None:
    """Each stage's own parser on the argument list it will get, so that a typo in `--rl_args` ends
    the call now, not after a bootstrap of several minutes."""
    from vprl.train.evaluation.pipeline import EvalConfig
    from vprl.train.recipe.parsing import ConfigError, parse_config
    from vprl.train.recipe.rl_config import parse_rl_config

    option = "--bootstrap"
    try:
        for seed in seeds:
            policy_config(seed, args)
        for arm in arms:
            option = f"--arm_args {arm}=..." if args.arm_args.get(arm) else "--rl_args"
            parse_rl_config(rl_argv(seeds[0], arm, Path(args.out) / f"policy_seed{seeds[0]}", args))
        option = "--eval_args"
        out = Path(args.out)
        parse_config(
            [EvalConfig], eval_argv(out / "policy", "", out / "world", out / "seen.jsonl", out / "eval", args)
        )
    except ConfigError as exc:
        fail(f"{option}: {exc}")


def policy_config(seed: int, args: argparse.Namespace):
    from vprl.train.bootstrap.fit import BootstrapConfig
    from vprl.train.recipe.parsing import parse_config

    out = Path(args.out) / f"policy_seed{seed}"
    (cfg,) = parse_config([BootstrapConfig], ["--out", str(out), "--seed", str(seed), *shlex.split(args.bootstrap)])
    return cfg


def rl_argv(seed: int, arm: str, policy: Path, args: argparse.Namespace) -> list[str]:
    """What `vprl.train.rl` gets for one arm of one seed."""
    return [
        "--config", str(ARMS[arm]),
        "--model_name_or_path", str(policy),
        "--dataset_root", str(policy / "world"),
        "--output_dir", str(Path(args.out) / f"seed{seed}" / arm),
        "--seed", str(seed),
        "--max_steps", str(args.max_steps),
        *shlex.split(args.rl_args),
        *shlex.split(args.arm_args.get(arm, "")),
    ]  # fmt: skip


def eval_argv(policy: Path, adapters: str, world: Path, seen: Path, out: Path, args: argparse.Namespace) -> list[str]:
    """What `vprl.train.evaluation` gets for one seed."""
    return [
        "--config", str(EVAL_CONFIG),
        "--model_name_or_path", str(policy),
        *(["--adapters", adapters] if adapters else []),
        "--shapes_root", str(world),
        "--seen_from", str(seen),
        "--out", str(out),
        *shlex.split(args.eval_args),
    ]  # fmt: skip
