"""Print a recipe's resolved values, for shell scripts: `python -m vprl.train.recipe KEY [KEY ...] -- --config
configs/X.yaml [--key value ...]` writes one `KEY=value` line per key (shell-quoted; lists comma-joined),
as `vprl/train/rl.py` would read the recipe with the same overrides."""

from __future__ import annotations

import contextlib
import shlex
import sys

from vprl.data.cli import fail
from vprl.train.recipe.parsing import ConfigError
from vprl.train.recipe.rl_config import parse_rl_config

USAGE = "usage: python -m vprl.train.recipe KEY [KEY ...] -- --config RECIPE [--key value ...]"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    if "--" not in argv:
        fail(f"python -m vprl.train.recipe: the recipe's arguments follow `--`\n{USAGE}")
    at = argv.index("--")
    keys, rest = argv[:at], argv[at + 1 :]
    try:
        # stdout is the shell's to read: whatever a library prints while the recipe is parsed goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            flat = parse_rl_config(rest).to_flat()
    except ConfigError as exc:
        fail(str(exc))
    unknown = [k for k in keys if k not in flat]
    if unknown:
        fail(f"python -m vprl.train.recipe: unknown recipe key(s) {unknown}")
    for key in keys:
        value = flat[key]
        text = ",".join(map(str, value)) if isinstance(value, list) else "" if value is None else str(value)
        print(f"{key}={shlex.quote(text)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
