"""The oracle's lexicon (`lexicon.yaml`): the names a broader name covers, attribute kinds, relations.

A scene graph holds names, attributes and relations as GQA wrote them; a program asks in other
words: "person" for a man, "vehicle" for a bus, "What color ...?" of an object whose attributes
mix colours, materials and states. The table says which words are which. docs/oracle.md says how
each call uses it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from vprl.executor.tools.inflection import same_noun

PATH = Path(__file__).with_name("lexicon.yaml")
ATTRIBUTE_KINDS = ("color", "material", "shape", "size")
_KIND_KEYS = {"color": "colors", "material": "materials", "shape": "shapes", "size": "sizes"}

# Names are compared word by word, words as the tools cut them ("t-shirt" is "t shirt").
_WORD = re.compile(r"[a-z]+")

# How a noun names an object: as its name exactly, as an inflection of it, or as a broader name.
EXACT, INFLECTED, BROADER = 3, 2, 1


@dataclass(frozen=True)
class Lexicon:
    members: dict[str, frozenset[str]]  # category -> every name it covers, itself and sub-categories' included
    aliases: dict[str, str]  # other wording -> category
    kinds: dict[str, frozenset[str]]  # attribute kind -> its words
    shades: frozenset[str]
    inverses: dict[str, str]
    synonyms: dict[str, tuple[str, ...]]  # relation name -> every name meaning the same, the canonical first
    prepositions: frozenset[str]
    other_kind_compounds: frozenset[str]


def _strings(value, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"{PATH.name}: {where}: expected a list of words, got {value!r:.80}")
    return [" ".join(v.lower().split()) for v in value]


def load_lexicon(path: Path = PATH) -> Lexicon:
    raw = yaml.safe_load(path.read_text())
    direct = {" ".join(k.split()): _strings(v, f"categories.{k}") for k, v in raw["categories"].items()}

    def closure(category: str, seen: frozenset[str]) -> set[str]:
        names = {category}
        for member in direct[category]:
            names.add(member)
            if member in direct and member not in seen:
                names |= closure(member, seen | {member})
        return names

    aliases = {" ".join(k.split()): v for k, v in raw["category_aliases"].items()}
    unknown = sorted(v for v in aliases.values() if v not in direct)
    if unknown:
        raise ValueError(f"{path.name}: category_aliases name no category: {unknown}")
    synonyms = {}
    for i, group in enumerate(raw["relation_synonyms"]):
        names = tuple(_strings(group, f"relation_synonyms[{i}]"))
        synonyms.update(dict.fromkeys(names, names))
    return Lexicon(
        members={c: frozenset(closure(c, frozenset({c}))) for c in direct},
        aliases=aliases,
        kinds={kind: frozenset(_strings(raw[key], key)) for kind, key in _KIND_KEYS.items()},
        shades=frozenset(_strings(raw["shades"], "shades")),
        inverses=dict(raw["inverse_relations"]),
        synonyms=synonyms,
        prepositions=frozenset(_strings(raw["prepositions"], "prepositions")),
        other_kind_compounds=frozenset(_strings(raw["other_kind_compounds"], "other_kind_compounds")),
    )


LEXICON = load_lexicon()


@lru_cache(maxsize=65536)
def noun_match(noun: tuple[str, ...], name: tuple[str, ...]) -> int:
    """How the noun (its words) names an object called `name` (its words): EXACT, INFLECTED or 0.

    The noun may be the name's last words: a "tennis racket" is a racket. The last word may be
    inflected ("buses" names a bus); the words before it must be equal.
    """
    k = len(noun)
    if not k or k > len(name):
        return 0
    if k < len(name) and " ".join(name) in LEXICON.other_kind_compounds:
        return 0
    tail = name[-k:]
    if tail[:-1] != noun[:-1]:
        return 0
    if tail[-1] == noun[-1]:
        return EXACT
    return INFLECTED if same_noun(noun[-1], tail[-1]) else 0


@lru_cache(maxsize=4096)
def category(noun: tuple[str, ...]) -> str | None:
    """The category a noun names, if any: "animals" -> "animal", "pieces of furniture" -> "furniture"."""
    text = " ".join(noun)
    if text in LEXICON.members:
        return text
    if text in LEXICON.aliases:
        return LEXICON.aliases[text]
    # Any word may carry the plural: "animals", "pieces of furniture", "kitchen appliances".
    for key in (*LEXICON.members, *LEXICON.aliases):
        words = _WORD.findall(key)
        if len(words) == len(noun) and all(same_noun(a, b) for a, b in zip(noun, words)):
            return LEXICON.aliases.get(key, key)
    return None


@lru_cache(maxsize=65536)
def covers(cat: str, name: tuple[str, ...]) -> bool:
    """Does the category cover an object called `name` (its words)? "person" covers "tennis player"."""
    return any(noun_match(tuple(_WORD.findall(member)), name) for member in LEXICON.members[cat])


def categories_of(name: tuple[str, ...]) -> list[str]:
    """Every category covering the name, in the table's order."""
    return [cat for cat in LEXICON.members if covers(cat, name)]


def attribute_kind(attribute: str) -> str | None:
    """color | material | shape | size for an attribute as a scene graph writes it, else None.

    A shade and a colour ("light blue", "dark brown") is a colour; "X colored" is a colour.
    """
    for kind in ATTRIBUTE_KINDS:
        if attribute in LEXICON.kinds[kind]:
            return kind
    words = attribute.split()
    if len(words) > 1 and (
        words[-1] == "colored" or (words[0] in LEXICON.shades and words[-1] in LEXICON.kinds["color"])
    ):
        return "color"
    if len(words) > 1 and words[-1] in LEXICON.kinds["material"]:
        return "material"
    return None


def implied(attribute: str) -> tuple[str, ...]:
    """Attributes an attribute implies: "light blue" is blue, "stainless steel" is steel."""
    words = attribute.split()
    kind = attribute_kind(attribute)
    if len(words) > 1 and kind in ("color", "material") and words[-1] in LEXICON.kinds[kind]:
        return (words[-1],)
    return ()


def synonyms(relation: str) -> tuple[str, ...]:
    """Every relation name meaning the same ("under" -> below, under, beneath, underneath)."""
    return LEXICON.synonyms.get(relation, (relation,))


def canonical(relation: str) -> str:
    return synonyms(relation)[0]


def inverse(relation: str) -> str | None:
    """The same relation seen from its object: "to the left of" -> "to the right of", "under" -> "above"."""
    return LEXICON.inverses.get(canonical(relation))
