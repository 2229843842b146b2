"""Reading the noun phrases that tools receive ("tennis racket", "light blue shirt") without a model.

Shared by the backends that answer from structure rather than pixels-to-text models: `oracle`
(scene graphs) and `shapes` (classical vision). A phrase is matched against one object's name and
attributes as whole phrases: its last words name the object (its name, an inflection of it, or a
broader name from the lexicon), and the words before them must be the object's attributes, each
attribute taken whole ("light blue" is one attribute, and implies "blue").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vprl.executor.tools.inflection import singular
from vprl.executor.tools.lexicon import BROADER, category, covers, implied, noun_match
from vprl.executor.tools.vocabulary import GENERIC_NOUNS, SYNONYMS

__all__ = ["ARTICLES", "GENERIC", "NounPhrase", "attribute_phrases", "norm_attr", "parse_noun_phrase", "singular"]

GENERIC = (*GENERIC_NOUNS, *(f"{noun}s" for noun in GENERIC_NOUNS))
ARTICLES = ("a", "an", "the", "any", "some", "this", "that", "these", "those", "his", "her", "its", "their")

_WORD = re.compile(r"[a-z]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def norm_attr(text: str) -> str:
    """One spelling per meaning, word by word: "grey" -> "gray", "wooden" -> "wood", "light grey" -> "light gray"."""
    return " ".join(SYNONYMS.get(w, w) for w in text.lower().split())


def attribute_phrases(attributes) -> frozenset[str]:
    """The (normalised) attributes an object has, with what each implies ("light blue" -> "blue")."""
    out = set(attributes)
    for a in attributes:
        out.update(implied(a))
    return frozenset(out)


def covered(tokens: tuple[str, ...] | list[str], phrases: frozenset[str]) -> bool:
    """Can the words be cut into consecutive pieces that are each one of `phrases`?"""
    tokens = [norm_attr(t) for t in tokens]
    reach = [True] + [False] * len(tokens)
    for end in range(1, len(tokens) + 1):
        reach[end] = any(reach[start] and " ".join(tokens[start:end]) in phrases for start in range(end))
    return reach[-1]


@dataclass(frozen=True)
class NounPhrase:
    head: str  # the last word as written, "" for generic words ("object", "thing")
    modifiers: tuple[str, ...]  # the words before it

    def match(self, name: str, attributes) -> int:
        """How well an object with this name and these (normalised) attributes fits: 0 (not at all),
        `BROADER` (a broader name or a generic word), `INFLECTED` or `EXACT` (its own name)."""
        phrases = attribute_phrases(attributes)
        if not self.head:
            return BROADER if covered(self.modifiers, phrases) else 0
        tokens = (*self.modifiers, self.head)
        name_words = tuple(words(name))
        best = 0
        # Every split into attributes + noun: "tennis racket" is a name, "red racket" an attribute
        # and a name, "light blue shirt" an attribute of two words and a name.
        for cut in range(len(tokens)):
            noun = tokens[cut:]
            quality = noun_match(noun, name_words)
            if not quality:
                cat = category(noun)
                quality = BROADER if cat is not None and covers(cat, name_words) else 0
            if quality > best and covered(tokens[:cut], phrases):
                best = quality
        return best

    def matches(self, name: str, attributes) -> bool:
        """Does an object with this name and these (normalised) attributes fit the phrase?"""
        return self.match(name, attributes) > 0


def parse_noun_phrase(text: str) -> NounPhrase:
    tokens = [w for w in words(text) if w not in ARTICLES]
    if not tokens:
        return NounPhrase("", ())
    if tokens[-1] in GENERIC:
        return NounPhrase("", tuple(tokens[:-1]))
    return NounPhrase(tokens[-1], tuple(tokens[:-1]))
