"""Short, useful error messages: they are what the LLM reads when re-prompted with its errors."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def nearest_names(name: str, candidates: Iterable[str], n: int = 4) -> list[str]:
    """The real names closest to a misspelt or invented one (prefix and substring hits first)."""
    pool = sorted({c for c in candidates if not c.startswith("_")})
    close = difflib.get_close_matches(name, pool, n=n, cutoff=0.5)
    # Invented names often share a word with the real one (`find_all` for `find`).
    words = [w for w in name.lower().split("_") if len(w) > 2]
    related = [c for c in pool if any(w in c.lower() for w in words)]

    # Rank by shared words, then spelling: `sort_patches_top_to_bottom` should suggest
    # `sort_patches_bottom_to_top` before `sort_patches_left_to_right`.
    def rank(c: str) -> tuple[int, float]:
        shared = len(set(words) & set(c.lower().split("_")))
        return (-shared, -difflib.SequenceMatcher(None, name, c).ratio())

    return sorted(dict.fromkeys(close + related), key=rank)[:n]


def unknown_attribute(owner: str, name: str, candidates: Iterable[str]) -> AttributeError:
    near = nearest_names(name, candidates)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    return AttributeError(f"{owner} has no attribute {name!r}{hint}")


def unknown_name(name: str, candidates: Iterable[str]) -> NameError:
    near = nearest_names(name, candidates)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    return NameError(f"name {name!r} is not defined{hint}")


def expect_str(method: str, argument: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{method}() expects {argument} to be a str, got {type(value).__name__} {value!r:.60}")
    return value


def expect_str_list(method: str, argument: str, value: object) -> list[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{method}() expects {argument} to be a list of str, got {value!r:.60}")
    if not value:
        raise ValueError(f"{method}() got an empty {argument}")
    return list(value)
