"""How every command line of vprl treats bad input: one line naming the place (file and line, key, or
option) on stderr, exit status 2, no traceback. A failure in the work itself keeps its traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn

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
    """argparse with the error first: `error: PROG: message`, then where to look, not the usage."""

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: {message}\n(`{self.prog} --help` lists the options)")


def quiet_console() -> None:
    """Silence what libraries print at every start that a user can do nothing about: bitsandbytes'
    note that its optional CPU kernel package is missing, and transformers' rename warning that
    trl and peft trigger themselves (`is_gradient_checkpointing`). Real warnings still show."""
    import logging
    import warnings

    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
