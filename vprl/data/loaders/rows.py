"""Reading the fields of one row of a dataset file: typed access that fails with a `RowError`.

A row parser raises `RowError` with a message that names only the row and key path; the bad-row
policy (`_common.BadRows`, `_common.parse_rows`) adds the file name, or skips the row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class RowError(ValueError):
    """Raised by row parsers with a location-only message; `BadRows` adds the file name."""


def get_field(row: Mapping[str, Any], key: str, where: str, kind: type | tuple[type, ...]) -> Any:
    """`row[key]`, which must exist and be of `kind` (bool never counts as a number)."""
    if not isinstance(row, Mapping):
        raise RowError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if key not in row:
        raise RowError(f"{where} is missing '{key}'")
    value = row[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    bad_bool = isinstance(value, bool) and bool not in kinds
    if bad_bool or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise RowError(f"{where} has '{key}' of type {type(value).__name__}, expected {names}")
    return value


def get_str(row: Mapping[str, Any], key: str, where: str, allow_empty: bool = False) -> str:
    value = get_field(row, key, where, str)
    if not allow_empty and not value.strip():
        raise RowError(f"{where} has an empty '{key}'")
    return value


def get_number(row: Mapping[str, Any], key: str, where: str) -> float:
    return float(get_field(row, key, where, (int, float)))


def get_id(row: Mapping[str, Any], key: str, where: str) -> str:
    """An identifier that official files store as either an int or a string."""
    return str(get_field(row, key, where, (int, str)))
