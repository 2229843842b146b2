"""How every command line of vprl treats bad input: one line naming the place (file and line, key, or
option) on stderr, exit status 2, no traceback. A failure in the work itself keeps its traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from vprl.data.ranges import NON_NEGATIVE, Range
from vprl.data.retired_names import retired_message

EXIT_BAD_INPUT = 2
# What reading a user's files and options raises when they are wrong (loaders and checks raise these
# with the place in the message; the library's own bugs raise other types or happen later).
BAD_INPUT: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError)


def fail(message: str) -> NoReturn:
    lines = str(message).strip().splitlines() or ["bad input"]
    print(f"error: {lines[0]}", file=sys.stderr)
    for line in lines[1:]:
        print(f"  {line}", file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def checked(step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`step(*args, **kwargs)`, ending the command with `fail` when the input it reads is wrong."""
    try:
        return step(*args, **kwargs)
    except BAD_INPUT as exc:
        fail(str(exc))


class CommandParser(argparse.ArgumentParser):
    """argparse with the error first: `error: PROG: message`, then where to look, not the usage.

    A numeric option (`type=int` or `float`) is range-checked: `value_range=` (a `vprl.data.ranges.Range`)
    says its range, not negative by default; NaN and infinity are always refused."""

    def add_argument(self, *args: Any, value_range: Range | None = None, **kwargs: Any) -> argparse.Action:
        args = _both_spellings(args)
        kind = kwargs.get("type")
        if kind in (int, float):
            kwargs["type"] = _ranged(kind, value_range or NON_NEGATIVE)
        elif value_range is not None:
            raise TypeError(f"value_range is for int or float options, not {args}")
        return super().add_argument(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        given = sys.argv[1:] if args is None else list(args)
        known = {name.lstrip("-").replace("-", "_") for action in self._actions for name in action.option_strings}
        for token in given:
            message = retired_message(token, known) if token.startswith("--") else None
            if message and token.lstrip("-").split("=", 1)[0].replace("-", "_") not in known:
                fail(f"{self.prog}: {message}")
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: {message}\n(`{self.prog} --help` lists the options)")


def _both_spellings(names: tuple[Any, ...]) -> tuple[Any, ...]:
    """`--push_to_hub` also as `--push-to-hub` and the reverse, as the config-file commands take
    their keys (trl's parser accepts both): the declared, documented spelling is snake_case everywhere."""
    out = list(names)
    for name in names:
        if isinstance(name, str) and name.startswith("--"):
            for other in ("--" + name[2:].replace("-", "_"), "--" + name[2:].replace("_", "-")):
                if other not in out:
                    out.append(other)
    return tuple(out)


def _ranged(kind: type, value_range: Range) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            expected = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        problem = value_range.problem(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def quiet_console() -> None:
    """Silence what libraries print at every start that a user can do nothing about: bitsandbytes'
    note that its optional CPU kernel package is missing, and transformers' rename warning that
    trl and peft trigger themselves (`is_gradient_checkpointing`). Real warnings still show."""
    import logging
    import warnings

    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
