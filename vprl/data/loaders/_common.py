"""Shared plumbing for the official-format loaders: file errors, bad-row policy, image checks.

Every loader follows the same rules, so they live here once:

* A missing file raises `DatasetFileNotFound`, naming the path and the official file that belongs
  there ("expected GQA questions file like val_balanced_questions.json").
* A file that is not valid JSON, or whose top level has the wrong shape, raises
  `DatasetFormatError` naming the file (and line/column for JSON syntax errors). These are never
  skippable: a broken file is not a bad row.
* A malformed row raises `DatasetFormatError` naming the file and the row's line or key path
  (row parsers raise `rows.RowError`; `BadRows`, or `parse_rows` around a whole loop, adds the
  file). With `skip_bad_rows=True` the row is skipped instead, and at the end of the file one
  `SkippedRowsWarning` is issued carrying the count and the first few reasons. We chose a warning
  (rather than a report object) so that every loader keeps returning a plain `list[Example]`;
  callers that need the numbers catch it with `warnings.catch_warnings(record=True)` and read
  `.count` / `.reasons` from the warning's message object.
* Image files are not opened or stat-ed by default: the full datasets hold hundreds of thousands
  of images while a run usually touches a small sample, and whoever opens the image reports a
  missing one with its path. `check_image_files(examples)` (or `check_images=True` on a loader) stats
  every image up front and fails listing the missing ones. A missing image is never skipped,
  even with `skip_bad_rows=True`: it means a wrong images folder far more often than a bad row.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from pathlib import Path
from typing import Any, TypeVar

from tqdm import tqdm

from vprl.data.loaders.rows import RowError
from vprl.data.records import Example

T = TypeVar("T")
R = TypeVar("R")

# Files with fewer rows than this load without a progress bar (tests, the shapes world).
PROGRESS_MIN_ROWS = 5000
# How many skip reasons a warning quotes; the count is always exact.
MAX_REASONS = 5
# The query form ViUniT uses for image-text matching items (Winoground, SugarCREPE).
ITM_QUERY = 'Verify image matches text="{caption}"'


class DatasetFileNotFound(FileNotFoundError):
    """A dataset file is missing; the message says which official file belongs there."""


class DatasetFormatError(ValueError):
    """A dataset file or row does not match the official format; the message names file and line/key."""


class SkippedRowsWarning(UserWarning):
    """Issued once per file when `skip_bad_rows=True` skipped at least one row."""

    def __init__(self, path: str | Path, count: int, reasons: Sequence[str]) -> None:
        self.path = str(path)
        self.count = count
        self.reasons = list(reasons)
        shown = "; ".join(self.reasons)
        more = f" (first {len(self.reasons)}: {shown})" if self.reasons else ""
        super().__init__(f"{self.path}: skipped {count} bad row(s){more}")


def require_file(path: str | Path, expected: str) -> Path:
    """Return `path` as a Path, or raise naming it and what belongs there."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "no such file"
        raise DatasetFileNotFound(f"{path}: {what}; expected {expected}")
    return path


def first_existing(candidates: Sequence[Path], expected: str) -> Path:
    """The first of `candidates` that exists; otherwise an error listing every place looked."""
    for cand in candidates:
        if cand.is_file():
            return cand
    looked = ", ".join(str(c) for c in candidates)
    raise DatasetFileNotFound(f"{candidates[0]}: no such file; expected {expected} (looked in: {looked})")


def load_json(path: str | Path, expected: str, top: type = dict) -> Any:
    """Load a whole JSON file whose top level must be `top` (dict or list)."""
    path = require_file(path, expected)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except json.JSONDecodeError as exc:
        raise DatasetFormatError(f"{path}: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise DatasetFormatError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not isinstance(data, top):
        raise DatasetFormatError(
            f"{path}: expected a JSON {'object' if top is dict else 'array'} at the top level, "
            f"got {type(data).__name__}; expected {expected}"
        )
    return data


class BadRows:
    """Applies the bad-row policy for one file: raise at once, or count, skip and warn at the end."""

    def __init__(self, path: str | Path, skip: bool) -> None:
        self.path = Path(path)
        self.skip = skip
        self.count = 0
        self.reasons: list[str] = []

    def handle(self, err: RowError) -> None:
        """Call from an `except RowError` block: re-raises with the file name unless skipping."""
        if not self.skip:
            raise DatasetFormatError(f"{self.path}: {err}") from None
        self.count += 1
        if len(self.reasons) < MAX_REASONS:
            self.reasons.append(str(err))

    def finish(self, stacklevel: int = 3) -> None:
        """Warn once about the skipped rows; `stacklevel` 3 points at whoever called the loader."""
        if self.count:
            warnings.warn(SkippedRowsWarning(self.path, self.count, self.reasons), stacklevel=stacklevel)


def parse_rows(
    rows: Iterable[T],
    parse: Callable[[T], R],
    path: str | Path,
    skip_bad_rows: bool,
    desc: str,
    total: int | None = None,
) -> list[R]:
    """`parse` of every row, in order, under the bad-row policy of the file at `path`."""
    bad = BadRows(path, skip_bad_rows)
    out: list[R] = []
    for row in progress(rows, desc, total):
        try:
            out.append(parse(row))
        except RowError as err:
            bad.handle(err)
    bad.finish(stacklevel=4)  # one frame deeper than a loader calling `finish` itself
    return out


def progress(items: Iterable[T], desc: str, total: int | None = None) -> Iterator[T]:
    """A tqdm bar for long loops only, so small files (tests, the shapes world) stay quiet."""
    n = total if total is not None else (len(items) if isinstance(items, Sized) else None)
    return iter(tqdm(items, desc=desc, total=n, disable=n is not None and n < PROGRESS_MIN_ROWS))


def check_image_files(examples: Sequence[Example], limit: int = 10) -> None:
    """Raise `DatasetFileNotFound` listing examples whose image file does not exist."""
    missing = [(ex.id, ex.image) for ex in progress(examples, "checking images") if not Path(ex.image).is_file()]
    if missing:
        shown = "; ".join(f"{i}: {p}" for i, p in missing[:limit])
        more = f" (and {len(missing) - limit} more)" if len(missing) > limit else ""
        raise DatasetFileNotFound(f"{len(missing)} of {len(examples)} image file(s) missing: {shown}{more}")
