"""Checking a JSON row against a dataclass's annotations before the dataclass is built: a string
where a list of strings belongs (`"answers": "yes"`) is refused naming the file, line and field,
instead of becoming `('y', 'e', 's')`. Covers what the records use: str, int, float, bool, None,
unions, tuple[X, ...], fixed tuples, list[X], dict[str, X] and Any."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union

_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", type(None): "null"}


def check_row(cls: type, row: dict[str, Any], where: str, required: tuple[str, ...] = ()) -> None:
    """Raise ValueError `{where}: {field}: ...` for an unknown, missing or mistyped field of `row`."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(row) - set(names))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; valid keys are {sorted(names)}")
    missing = [n for n in required if n not in row]
    if missing:
        raise ValueError(f"{where}: missing key(s) {missing}")
    for name, value in row.items():
        problem = mismatch(value, hints[name])
        if problem:
            raise ValueError(f"{where}: {name}: expected {problem}, got {type(value).__name__} {value!r:.60}")


def mismatch(value: Any, hint: Any) -> str | None:
    """None when `value` (parsed JSON) fits `hint`, else what was expected, in words."""
    if hint is Any:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return None if any(mismatch(value, a) is None for a in args) else " or ".join(_words(a) for a in args)
    if hint in _NAMES:
        ok = isinstance(value, hint) and not (hint is int and isinstance(value, bool))
        if hint is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else _NAMES[hint]
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            return _words(hint)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                return f"{len(args)} values"
            return next((m for v, a in zip(value, args, strict=True) if (m := mismatch(v, a))), None)
        item = args[0] if args else Any
        return next((f"{_words(hint)} ({m} inside)" for v in value if (m := mismatch(v, item))), None)
    if origin is dict or hint is dict:
        return None if isinstance(value, dict) else "a mapping"
    return None  # a type the records do not use: not checked here


def _words(hint: Any) -> str:
    if hint in _NAMES:
        return _NAMES[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple and args and args[-1] is not Ellipsis:
        return f"a list of {len(args)} {_words(args[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin in (tuple, list) and args:
        return f"a list of {_words(args[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin is dict or hint is dict:
        return "a mapping"
    return getattr(hint, "__name__", str(hint))
