"""The `vprl` command, after trl's `trl` CLI: `vprl COMMAND [options]` runs one of the project's
commands, each exactly as `python -m MODULE [options]` runs it (`vprl COMMAND --help` lists its
options). Under `accelerate launch`, train with `accelerate launch -m vprl.train.rl ...` instead:
accelerate starts a module or a script, not a console command.
"""

from __future__ import annotations

import runpy
import sys

# command -> (module run as __main__, what it does); the order is the order of a project's life
COMMANDS: dict[str, tuple[str, str]] = {
    "quickstart": ("vprl.train.quickstart", "the whole loop on the shapes world, on a CPU (make quickstart)"),
    "shapes": ("vprl.data.shapes", "write a shapes world (procedural images, questions, gold programs)"),
    "bootstrap": ("vprl.train.bootstrap", "fit the tiny policy on a shapes world"),
    "run": ("vprl.executor.run", "run programs on examples in the sandbox"),
    "serve": ("vprl.executor.serve", "deploy a tool stack as a service"),
    "prepare-unit-tests": ("vprl.train.prepare_unit_tests", "write a recipe's visual unit tests before training"),
    "train": ("vprl.train.rl", "RL fine-tuning from a recipe (GRPO, RLOO, ReST)"),
    "recipe": ("vprl.train.recipe", "print a recipe's resolved values, for shell scripts"),
    "evaluate": ("vprl.train.evaluation", "evaluate policies and adapters, with inference modes"),
    "view": ("vprl.train.view", "write the run viewer's page for a run or an evaluation"),
    "export": ("vprl.train.export", "export a run's adapter (merged, or to the hub)"),
    "ace": ("vprl.train.ace", "automatically generated in-context examples"),
    "verl-data": ("vprl.train.integrations.verl_data", "a recipe's data and reward settings for verl"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items())
    return (
        "usage: vprl COMMAND [options]\n\n"
        "Reinforcement learning for visual program generators.\n\n"
        f"commands:\n{rows}\n\n"
        "`vprl COMMAND --help` lists a command's options; `vprl --version` prints the version."
    )


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if args[0] == "--version":
        from vprl import __version__

        print(f"vprl {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"vprl: unknown command {command!r}; the commands are {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    # The module reads sys.argv as `python -m MODULE` would give it; argparse names it `vprl COMMAND`.
    sys.argv = [f"vprl {command}", *rest]
    runpy.run_module(COMMANDS[command][0], run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
