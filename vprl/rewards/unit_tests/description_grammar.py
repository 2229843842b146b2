"""The grammar of a unit test's image description in the shapes world: text in, objects and constraints out.

The layout generator (`vprl/rewards/unit_tests/layout.py`) reads the descriptions a test writer produces, e.g.

    "A grey background with a large red circle to the left of a small blue square and a star."
    "From left to right: a green triangle, a red circle, a green square."
    "A small blue hexagon in the top half of the image; no red objects."

Object mentions are `[count] [size] [colour] shape` (`object` = any shape, plurals allowed);
"the X" refers back to an earlier X; `no X` / `without X` excludes X. Between two mentions a
relation word (left of, right of, above, below) constrains them; after a mention a region ("on the
left side", "in the top half of the image", "in the top left corner") constrains it; "from left to
right:" / "from top to bottom:" orders the listed objects. `parse_description` returns what it
read as a `DescriptionSpec`; it never fails (text it cannot read is passed over).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from vprl.data.shapes.scene import SHAPES, SIZES
from vprl.executor.tools.vocabulary import SIZE_SYNONYMS
from vprl.rewards.unit_tests.scene_text import COLOR_PATTERN

_NUMBERS = {"a": 1, "an": 1, "one": 1, "another": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
_SIZE_WORDS = {**{size: size for size in SIZES}, **SIZE_SYNONYMS}  # word -> the shapes world's size
# Fewer than `vocabulary.GENERIC_NOUNS`: "an item" has never been read as a shape mention here.
_GENERIC = ("object", "shape", "thing")
_NUM = "|".join([*_NUMBERS, r"\d+", "the", "some"])
_SIZE = "|".join(_SIZE_WORDS)
_SHAPE = "|".join([*SHAPES, *_GENERIC])
_MENTION = re.compile(
    rf"\b(?:(?P<neg>no|without(?:\s+any)?(?:\s+an?)?|not\s+any)\s+)?(?:(?P<num>{_NUM})\s+)?"
    rf"(?:(?P<size1>{_SIZE})\s+)?(?:(?P<color>{COLOR_PATTERN})(?:\s+colou?red)?\s+)?(?:(?P<size2>{_SIZE})\s+)?"
    rf"(?P<shape>{_SHAPE})(?P<plural>e?s)?\b"
)
_ORDER = re.compile(r"from\s+(left\s+to\s+right|right\s+to\s+left|top\s+to\s+bottom|bottom\s+to\s+top)\s*[:,]?\s*")
_FRAME = r"(?:image|picture|canvas|scene|frame|photo)"
_REGION = re.compile(
    rf"\b(?:on|in|at|to|near|towards)\s+the\s+(?:far\s+|very\s+)?"
    rf"(?P<v>top|bottom|upper|lower)?[\s-]*(?P<h>left|right)?"
    rf"(?:\s+(?:side|half|edge|part|corner|area|region))?(?P<of>\s+of\s+the\s+{_FRAME})?"
)
# relation word -> (axis, sign): "a R b" means sign * (b - a) >= AXIS_GAP on that axis (top-left pixels)
_RELATIONS = (
    (re.compile(r"\b(?:to\s+the\s+|on\s+the\s+)?left\s+of\b"), ("x", 1)),
    (re.compile(r"\b(?:to\s+the\s+|on\s+the\s+)?right\s+of\b"), ("x", -1)),
    (re.compile(r"\b(?:above|over|on\s+top\s+of|higher\s+than)\b"), ("y", 1)),
    (re.compile(r"\b(?:below|under|underneath|beneath|lower\s+than)\b"), ("y", -1)),
)


@dataclass
class Mention:
    """One object phrase: how many, which attributes were named, excluded or not, where it must be."""

    count: int
    size: str | None
    color: str | None
    shape: str | None  # None: any shape
    negated: bool = False
    regions: set[str] = field(default_factory=set)  # left / right / top / bottom

    def matches(self, size: str | None, color: str | None, shape: str | None) -> bool:
        return (
            (self.size is None or size is None or self.size == size)
            and (self.color is None or color is None or self.color == color)
            and (self.shape is None or shape is None or self.shape == shape)
        )


def _parse_mention(m: re.Match) -> Mention:
    num, shape = m.group("num"), m.group("shape")
    if num is None or num in ("the", "some"):
        count = 2 if m.group("plural") and num is None or num == "some" else 1
    else:
        count = _NUMBERS.get(num) or int(num)
    size_word = m.group("size1") or m.group("size2")
    return Mention(
        count=count,
        size=_SIZE_WORDS[size_word] if size_word else None,
        color=m.group("color"),
        shape=None if shape in _GENERIC else shape,
        negated=m.group("neg") is not None,
    )


def _regions(gap: str) -> tuple[set[str], str]:
    """Regions named in the text after a mention, and that text without them (for relations)."""
    found: set[str] = set()

    def take(m: re.Match) -> str:
        v, h = m.group("v"), m.group("h")
        rest = gap[m.end() :]
        # "to the left of <object>" is a relation, not a region; "of the image" was consumed.
        if (not v and not h) or (m.group("of") is None and re.match(r"\s+of\b", rest)):
            return m.group(0)
        if v:
            found.add({"upper": "top", "lower": "bottom"}.get(v, v))
        if h:
            found.add(h)
        return " "

    return found, _REGION.sub(take, gap)


def _relation(gap: str) -> tuple[str, int] | None:
    for pattern, rel in _RELATIONS:
        if pattern.search(gap):
            return rel
    return None


@dataclass
class DescriptionSpec:
    """What a description asks for; relations and orders refer to mentions by index."""

    mentions: list[Mention] = field(default_factory=list)
    relations: list[tuple[int, str, int, int]] = field(default_factory=list)  # (a, axis, sign, b)
    orders: list[tuple[str, int, list[int]]] = field(default_factory=list)  # (axis, sign, mentions in order)


def _read(text: str, spec: DescriptionSpec) -> list[int]:
    """Add the mentions of one stretch of text to `spec`; returns their indices (positives only)."""
    matches = list(_MENTION.finditer(text))
    indices: list[int | None] = []
    for m in matches:
        mention = _parse_mention(m)
        if m.group("num") == "the" and not mention.negated:
            # "the red circle" refers back to an earlier positive mention of that kind, if any
            earlier = [
                i
                for i, e in enumerate(spec.mentions)
                if not e.negated and (e.size, e.color, e.shape) == (mention.size, mention.color, mention.shape)
            ]
            if earlier:
                indices.append(earlier[-1])
                continue
        spec.mentions.append(mention)
        indices.append(len(spec.mentions) - 1)
    for k, m in enumerate(matches):
        end = matches[k + 1].start() if k + 1 < len(matches) else len(text)
        regions, rest = _regions(text[m.end() : end])
        me = indices[k]
        if me is not None and not spec.mentions[me].negated:
            spec.mentions[me].regions |= regions
        if k + 1 < len(matches) and (rel := _relation(rest)) is not None:
            other = indices[k + 1]
            if me != other and not spec.mentions[me].negated and not spec.mentions[other].negated:
                spec.relations.append((me, rel[0], rel[1], other))
    return [i for i in dict.fromkeys(indices) if i is not None and not spec.mentions[i].negated]


def parse_description(description: str) -> DescriptionSpec:
    """The mentions, relations and orderings of one description (case and quotes ignored)."""
    text = " ".join(description.lower().replace('"', " ").split())
    spec = DescriptionSpec()
    # Orderings first: "from left to right: a, b and c" up to the end of the sentence.
    rest = []
    pos = 0
    for m in _ORDER.finditer(text):
        rest.append(text[pos : m.start()])
        end = re.search(r"[.;\n]", text[m.end() :])
        stop = m.end() + end.start() if end else len(text)
        direction = m.group(1).split()
        axis = "x" if direction[0] in ("left", "right") else "y"
        sign = 1 if direction[0] in ("left", "top") else -1
        listed = _read(text[m.end() : stop], spec)
        spec.orders.append((axis, sign, listed))
        pos = stop
    rest.append(text[pos:])
    for chunk in rest:
        for sentence in re.split(r"[.;\n]", chunk):
            _read(sentence, spec)
    return spec


__all__ = ["DescriptionSpec", "Mention", "parse_description"]
