"""Singular and plural nouns (and the "-ing" form of verbs), from the `inflect` library.

A word alone cannot be singularised safely: any inflection library, given "bus" or "tennis",
strips the final "s" ("bu", "tenni"), because nothing tells it the word is already singular. So
the tools never singularise a word and then compare; they ask whether two words are forms of one
noun (`same_noun`), with one of them a name the scene holds. Pluralising a known singular is what
inflection libraries get right (bus -> buses, person -> people, goose -> geese).
"""

from __future__ import annotations

from functools import cache, lru_cache


@cache
def _engine():
    # Imported on first use: `inflect` type-checks its engine at import time (1.5 s on an idle
    # core, 9 s measured on a busy one), and most comparisons are of equal words that never need it.
    import inflect

    return inflect.engine()


def load() -> None:
    """Import the library now: a tool host does it before its first call (`OracleBackend.preload`),
    so the import is not spent out of that call's timeout."""
    _engine()


@lru_cache(maxsize=65536)
def plural(word: str) -> str:
    """The plural of a singular noun ("bus" -> "buses", "person" -> "people")."""
    if not word.isalpha():
        return word
    return _engine().plural_noun(word) or word


@lru_cache(maxsize=65536)
def singular(word: str) -> str:
    """The library's best guess at the singular of `word` (the word itself when it sees no plural).

    A guess only: "bus" comes back "bu". Compare with `same_noun` wherever the other word is known.
    """
    if not word.isalpha():
        return word
    return _engine().singular_noun(word) or word


@lru_cache(maxsize=65536)
def participle(verb: str) -> str:
    """The "-ing" form of a verb ("wears" -> "wearing", "sits" -> "sitting"), as GQA names actions."""
    if not verb.isalpha():
        return verb
    return _engine().present_participle(verb) or verb


def same_noun(a: str, b: str) -> bool:
    """Are `a` and `b` the same noun, in the singular or the plural ("buses"/"bus", "men"/"man")?"""
    if a == b:
        return True
    if not (a and b) or a[0] != b[0]:
        return False  # English plurals keep the first letter: no need to wake the library
    return plural(a) == b or plural(b) == a or singular(a) == b or singular(b) == a
