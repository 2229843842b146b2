"""The run folder's JSON-lines logs (rollouts, metrics, episodes): reading their whole rows and
cutting them back to a checkpoint's step, one way for all of them.

Every log appends flushed rows, so after a kill a file holds whole rows and at most one torn last
line: reading drops it with a warning, and a bad line anywhere else is an error naming the file and
line. A resumed run cuts each log back to the step of the checkpoint it restores, so the steps it
replays are logged exactly once; the cut is written to a temporary file and moved into place, so a
kill during it leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

Row = TypeVar("Row")


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _as_is(row: dict[str, Any], where: str) -> dict[str, Any]:
    return row


def read_rows(path: Path, parse: Callable[[dict[str, Any], str], Row] = _as_is) -> list[Row]:
    """Every whole row of `path` through `parse(row, "path:line")` (which raises TypeError or
    ValueError on a bad row); [] when there is no file."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    rows: list[Row] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(parse(json.loads(line), f"{path}:{n}"))
        except (json.JSONDecodeError, TypeError, ValueError) as e:
            if n == len(lines):  # the last line has no newline: a write that never finished
                warnings.warn(f"{path}:{n}: dropping a torn last line ({e})", stacklevel=3)
                continue
            if isinstance(e, json.JSONDecodeError):
                raise ValueError(f"{path}:{n}: not valid JSON ({e})") from None
            raise  # `parse` names the file and line
    return rows


def cut_rows(
    path: Path,
    keep: Callable[[Row], bool],
    dump: Callable[[Row], str] = json.dumps,
    parse: Callable[[dict[str, Any], str], Row] = _as_is,
) -> int:
    """Keep the rows of `path` that `keep` accepts, without a torn last line, each written back as
    `dump(row)`; returns how many rows went. The file is rewritten only when its text changes."""
    if not path.is_file():
        return 0
    rows = read_rows(path, parse)
    kept = [row for row in rows if keep(row)]
    text = "".join(dump(row) + "\n" for row in kept)
    if text != path.read_text(encoding="utf-8"):
        atomic_write(path, text)
    return len(rows) - len(kept)


def up_to(step: int | None, step_of: Callable[[Any], int]) -> Callable[[Any], bool]:
    """The `keep` rule of a resume from the checkpoint of `step`: rows of steps <= it (none when
    there is no checkpoint)."""
    return lambda row: step is not None and step_of(row) <= step
