"""Reading the short texts that tools receive (noun phrases, simple questions) without a model.

Shared by the backends that answer from structure rather than pixels-to-text models: `oracle`
(scene graphs) and `shapes` (classical vision). A real VQA model needs none of this.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from executor.tools.vocabulary import GENERIC_NOUNS, SYNONYMS

GENERIC = (*GENERIC_NOUNS, *(f"{noun}s" for noun in GENERIC_NOUNS))
ARTICLES = ("a", "an", "the", "any", "some", "this", "that", "these", "those")

_WORD = re.compile(r"[a-z]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def singular(word: str) -> str:
    if len(word) > 3 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith(("ses", "xes", "ches", "shes")):
        return word[:-2]
    if len(word) > 2 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def norm_attr(word: str) -> str:
    word = word.lower()
    return SYNONYMS.get(word, word)


@dataclass(frozen=True)
class NounPhrase:
    head: str  # singular noun, "" for generic words ("object", "thing")
    modifiers: tuple[str, ...]  # normalised attributes

    def matches(self, name: str, attributes: set[str] | frozenset[str]) -> bool:
        """Does an object with this name and these (normalised) attributes fit the phrase?"""
        name_words = [singular(w) for w in words(name)]
        head_ok = not self.head or (bool(name_words) and self.head == name_words[-1])
        # Multi-word names ("traffic light"): words of the name before the head are not modifiers.
        mods = [m for m in self.modifiers if m not in name_words[:-1]]
        return head_ok and all(m in attributes for m in mods)


def parse_noun_phrase(text: str) -> NounPhrase:
    tokens = [w for w in words(text) if w not in ARTICLES]
    if not tokens:
        return NounPhrase("", ())
    head = singular(tokens[-1])
    if tokens[-1] in GENERIC or head in GENERIC:
        head = ""
    return NounPhrase(head, tuple(norm_attr(w) for w in tokens[:-1]))


@dataclass(frozen=True)
class Question:
    kind: str  # what | color | shape | size | material | action | exists | count | verify | unknown
    target: str = ""  # the noun phrase the question is about ("" = the region itself)
    value: str = ""  # the attribute asked about, for `verify`


_PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    ("count", re.compile(r"^how many (?P<target>.+?)(?: are there| are in .*| can you see| do you see)?$")),
    ("exists", re.compile(r"^(?:is|are) there (?P<target>.+?)(?: in .*)?$")),
    ("color", re.compile(r"^what colou?r (?:is|are) (?P<target>.+)$")),
    ("color", re.compile(r"^what is the colou?r of (?P<target>.+)$")),
    ("color", re.compile(r"^what is the colou?r$")),  # Stanic et al. and ViUniT ask this of a found patch
    ("shape", re.compile(r"^what shape (?:is|are) (?P<target>.+)$")),
    ("shape", re.compile(r"^what is the shape of (?P<target>.+)$")),
    ("size", re.compile(r"^what size (?:is|are) (?P<target>.+)$")),
    ("size", re.compile(r"^(?:is|are) (?P<target>.+?) (?:small|large|big|tiny) or (?:small|large|big|tiny)$")),
    ("material", re.compile(r"^what (?:material|is (?P<t2>.+?) made of)(?: is (?P<target>.+))?$")),
    ("action", re.compile(r"^what (?:is|are) (?P<target>.+?) doing$")),
    (
        "what",
        re.compile(r"^what (?:is|kind of object is|object is|type of object is|shape is) (?P<target>this|it|that)$"),
    ),
    ("what", re.compile(r"^what (?:is|are) (?:this|it|that|in the (?:image|picture|photo))$")),
    ("what", re.compile(r"^what (?:kind of object|object|thing) is (?P<target>.+)$")),
    ("verify", re.compile(r"^(?:is|are|does) (?P<target>.+?) (?:look )?(?P<value>[a-z]+)$")),
)


def parse_question(question: str) -> Question:
    """Classify a simple question. The patterns cover what programs ask of `simple_query`;
    anything else is `unknown` and the backend says it cannot answer."""
    q = " ".join(words(question.replace("'s", "")))
    for kind, pattern in _PATTERNS:
        m = pattern.match(q)
        if m:
            groups = m.groupdict()
            target = groups.get("target") or groups.get("t2") or ""
            if target in ("this", "it", "that"):
                target = ""
            return Question(kind, target, groups.get("value") or "")
    return Question("unknown")
