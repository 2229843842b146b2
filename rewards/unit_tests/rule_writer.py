"""A rule-based test writer for the shapes world ("shapes_rules"): what an LLM test writer does,
done by rules so the unit-test reward means something on a CPU without a capable LLM.

It reads the query text alone (never the question's image, its labels or its scene graph) and
recognises the shapes world's question templates (`data/shapes/questions.py`) and image-text
captions (`Verify image matches text="..."`). For each it imagines small scenes in words, the way
ViUniT's few-shot prompts ask an LLM to: scenes where each possible answer is right, with
distractors and near-misses (the queried kind in the wrong colour, on the other side, one too
many), and writes them as `UnitTest(description, expected answer)`. Descriptions use the grammar
the layout generator reads (`rewards/unit_tests/layout.py`). Candidates vary in answers and in
wording, so the sampler (Algorithm 1) has answers to cover and inputs to spread.

A query no template matches gets no tests and a counted warning (`unrecognised_query`).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from data.shapes.scene import COLORS, SHAPES
from rewards.unit_tests.parsing import UnitTest
from rewards.unit_tests.protocols import register_writer
from rewards.unit_tests.scene_text import (
    ImpossibleScene,
    Ref,
    Scene,
    describe,
    distractors,
    fill,
    near_miss,
    other,
    parse_plural,
    parse_ref,
)

SIZES = ("small", "large")
_C = "|".join(COLORS)
_S = "|".join(SHAPES)
_REF = rf"(?:(?:small|large) )?(?:(?:{_C}) )?(?:{_S}|object)"
_PLURAL = rf"(?:(?:{_C}) )?(?:{_S}|object)s"
_REL = r"to the left of|to the right of|above|below"
_ITM = re.compile(r'^verify image matches text\s*=\s*"(?P<caption>.+)"$', re.I)

Writer = Callable[[np.random.Generator, dict[str, str], int], list[tuple[Scene, str]]]


# -- families ------------------------------------------------------------------------------------
def _binary(rng, n: int, make_yes, make_no) -> list[tuple[Scene, str]]:
    return [(make_yes(rng), "yes") if i % 2 == 0 else (make_no(rng), "no") for i in range(n)]


def exist(rng, slots, n):
    target = Ref(color=slots["color"], shape=slots["shape"])
    yes = lambda r: Scene([fill(r, target)] + distractors(r, r.integers(0, 4)))  # noqa: E731

    def no(r):
        objs = [near_miss(r, target)] + distractors(r, r.integers(0, 3), avoid=[target])
        return Scene(objs, absent=[target] if r.random() < 0.3 else [])

    return _binary(rng, n, yes, no)


def count(rng, slots, n):
    kind = parse_plural(slots["noun"])
    out = []
    for i in range(n):
        k = [0, 1, 2, 3, 4][i % 5] if i < 5 else int(rng.integers(0, 5))
        objs = [fill(rng, kind, small=True) for _ in range(k)]
        objs += [near_miss(rng, kind, small=True) for _ in range(int(rng.integers(0, 2)))]
        objs += distractors(rng, rng.integers(0, 3), avoid=[kind], small=True)
        out.append((Scene(objs), str(k)))
    return out


def _query_attr(attr: str):
    def write(rng, slots, n):
        ref = parse_ref(slots["ref"])
        vocab = {"color": COLORS, "shape": SHAPES, "size": SIZES}[attr]
        out = []
        for i in range(n):
            value = vocab[i % len(vocab)] if attr == "size" else vocab[int(rng.integers(len(vocab)))]
            target = fill(rng, replace(ref, **{attr: value}))
            objs = [target]
            if rng.random() < 0.7:  # a near-miss that answers differently
                objs.append(near_miss(rng, ref, **{attr: other(rng, vocab, value)}))
            objs += distractors(rng, rng.integers(0, 3), avoid=[ref])
            out.append((Scene(objs), value))
        return out

    return write


def verify_color(rng, slots, n):
    ref, color = parse_ref(slots["ref"]), slots["color"]

    def yes(r):
        return Scene([fill(r, replace(ref, color=color))] + distractors(r, r.integers(0, 3), avoid=[ref]))

    def no(r):
        objs = [fill(r, replace(ref, color=other(r, COLORS, color)))]
        objs += [fill(r, Ref(color=color), avoid=[ref])]  # the asked colour is in the picture, elsewhere
        return Scene(objs + distractors(r, r.integers(0, 2), avoid=[ref]))

    return _binary(rng, n, yes, no)


def _choose(attr: str):
    def write(rng, slots, n):
        ref, options = parse_ref(slots["ref"]), (slots["a"], slots["b"])
        out = []
        for i in range(n):
            right, wrong = options[i % 2], options[1 - i % 2]
            objs = [fill(rng, replace(ref, **{attr: right}))]
            if rng.random() < 0.6:
                objs.append(fill(rng, Ref(**{attr: wrong}), avoid=[ref]))
            out.append((Scene(objs + distractors(rng, rng.integers(0, 3), avoid=[ref])), right))
        return out

    return write


def _same(attr: str):
    vocab = {"color": COLORS, "shape": SHAPES}[attr]

    def write(rng, slots, n):
        r1, r2 = parse_ref(slots["r1"]), parse_ref(slots["r2"])

        def make(r, same: bool):
            v1 = vocab[int(r.integers(len(vocab)))]
            v2 = v1 if same else other(r, vocab, v1)
            o1 = fill(r, replace(r1, **{attr: v1}), avoid=[r2])
            o2 = fill(r, replace(r2, **{attr: v2}), avoid=[r1])
            return Scene([o1, o2] + distractors(r, r.integers(0, 3), avoid=[r1, r2]))

        return _binary(rng, n, lambda r: make(r, True), lambda r: make(r, False))

    return write


def _logic(op: str):
    def write(rng, slots, n):
        refs = (parse_ref(slots["p1"]), parse_ref(slots["p2"]))
        patterns = [(True, True), (True, False), (False, True), (False, False)]
        # A present thing that fits the other phrase makes it present too ("a circle" and "a yellow
        # circle"): such patterns cannot be drawn.
        patterns = [
            p
            for p in patterns
            if not any(p[j] and not p[i] and _subsumes(refs[i], refs[j]) for i in (0, 1) for j in (0, 1) if i != j)
        ]
        out = []
        for i in range(n):
            present = patterns[i % len(patterns)]
            objs = [fill(rng, ref) for ref, p in zip(refs, present) if p]
            absent = [ref for ref, p in zip(refs, present) if not p]
            objs += [near_miss(rng, ref, avoid=absent) for ref in absent]
            objs += distractors(rng, rng.integers(0, 3), avoid=absent)
            truth = all(present) if op == "and" else any(present)
            out.append((Scene(objs), "yes" if truth else "no"))
        return out

    return write


def _subsumes(general: Ref, specific: Ref) -> bool:
    """Everything that fits `specific` fits `general`."""
    have = specific.specified()
    return all(have.get(k) == v for k, v in general.specified().items())


def _position(axis: str):
    sides = ("left", "right") if axis == "x" else ("top", "bottom")

    def write(rng, slots, n):
        ref = parse_ref(slots["ref"])
        out = []
        for i in range(n):
            side = sides[i % 2]
            objs = [replace(fill(rng, ref), where=side)]
            if rng.random() < 0.5:  # something else on the other side
                objs.append(replace(fill(rng, Ref(), avoid=[ref]), where=sides[1 - i % 2]))
            out.append((Scene(objs + distractors(rng, rng.integers(0, 3), avoid=[ref])), side))
        return out

    return write


def superlative_size(rng, slots, n):
    largest = slots["word"] == "largest"
    noun = Ref(shape=None if slots["noun"] == "object" else slots["noun"])
    out = []
    for _ in range(n):
        group = [fill(rng, noun) for _ in range(int(rng.integers(2, 4)))]
        colors = [COLORS[int(i)] for i in rng.permutation(len(COLORS))[: len(group)]]
        extreme, rest = ("large", "small") if largest else ("small", "large")
        group = [replace(o, color=c, size=extreme if k == 0 else rest) for k, (o, c) in enumerate(zip(group, colors))]
        objs = list(group)
        if noun.shape is not None:  # a bigger (or smaller) thing of another shape: the near-miss
            objs += [replace(d, size=extreme) for d in distractors(rng, rng.integers(1, 3), avoid=[noun])]
        out.append((Scene(objs), group[0].color))
    return out


EXTREMES = {"leftmost": ("x", 0), "rightmost": ("x", -1), "topmost": ("y", 0), "bottommost": ("y", -1)}


def superlative_position(rng, slots, n):
    axis, end = EXTREMES[slots["word"]]
    kind = Ref(color=slots.get("color"))
    out = []
    for _ in range(n):
        shapes = [SHAPES[int(i)] for i in rng.permutation(len(SHAPES))[: int(rng.integers(2, 4))]]
        group = [fill(rng, replace(kind, shape=s), small=True) for s in shapes]
        others = distractors(rng, rng.integers(0, 3), avoid=[kind], small=True) if kind.color else []
        sequence = list(group)
        for d in others:  # distractors anywhere in the order, even beyond the group's extreme
            sequence.insert(int(rng.integers(len(sequence) + 1)), d)
        answer = [o for o in sequence if kind.matches(o)][end].shape
        out.append((Scene(sequence, order=axis), answer))
    return out


# relation -> (axis, the target comes before the anchor in "from left to right" / "from top to bottom")
RELATIONS = {
    "to the left of": ("x", True),
    "to the right of": ("x", False),
    "above": ("y", True),
    "below": ("y", False),
}


def relate_query(rng, slots, n):
    ref, axis_before = parse_ref(slots["ref"]), RELATIONS[slots["rel"]]
    axis, before = axis_before
    kind = Ref(shape=slots["shape"])
    out = []
    for _ in range(n):
        anchor = fill(rng, ref, small=True)
        target = fill(rng, kind, avoid=[ref], small=True)
        sequence = [target, anchor] if before else [anchor, target]
        if rng.random() < 0.6:  # the same shape on the other side, in another colour
            decoy = fill(rng, kind, avoid=[ref, replace(kind, color=target.color)], small=True)
            sequence = [*sequence, decoy] if before else [decoy, *sequence]
        for d in distractors(rng, rng.integers(0, 2), avoid=[ref, kind], small=True):
            sequence.insert(int(rng.integers(len(sequence) + 1)), d)
        out.append((Scene(sequence, order=axis), target.color))
    return out


def relate_exist(rng, slots, n):
    ref, (axis, before) = parse_ref(slots["ref"]), RELATIONS[slots["rel"]]
    kind = Ref(color=slots["color"])

    def make(r, yes: bool):
        anchor = fill(r, ref, small=True)
        sequence = [anchor]
        if yes or r.random() < 0.6:  # for "no": the colour only on the wrong side (a near-miss), or absent
            obj = fill(r, kind, avoid=[ref], small=True)
            sequence = [obj, anchor] if before == yes else [anchor, obj]
        for d in distractors(r, r.integers(0, 3), avoid=[ref, kind], small=True):
            sequence.insert(int(r.integers(len(sequence) + 1)), d)
        return Scene(sequence, order=axis)

    return _binary(rng, n, lambda r: make(r, True), lambda r: make(r, False))


def compare_count(rng, slots, n):
    k1, k2 = parse_plural(slots["p1"]), parse_plural(slots["p2"])
    pairs = [(2, 1), (1, 2), (3, 1), (2, 2), (1, 0), (0, 1), (3, 2), (1, 1)]
    out = []
    for i in range(n):
        n1, n2 = pairs[i % len(pairs)] if i < len(pairs) else tuple(int(v) for v in rng.integers(0, 4, size=2))
        objs = [fill(rng, k1, avoid=[k2], small=True) for _ in range(n1)]
        objs += [fill(rng, k2, avoid=[k1], small=True) for _ in range(n2)]
        objs += distractors(rng, rng.integers(0, 2), avoid=[k1, k2], small=True)
        out.append((Scene(objs), "yes" if n1 > n2 else "no"))
    return out


# -- image-text matching -------------------------------------------------------------------------
_PHRASE = rf"(?:(?:{_C}) )?(?:{_S})"
_CAPTION = re.compile(rf"^an? (?P<p1>{_PHRASE})(?: (?P<link>and|{_REL}) an? (?P<p2>{_PHRASE}))?$")


def itm(rng, slots, n):
    m = _CAPTION.match(slots["caption"].strip().lower().rstrip("."))
    if m is None:
        return []
    r1 = parse_ref(m.group("p1"))
    if m.group("p2") is None:
        return exist(rng, {"color": r1.color, "shape": r1.shape}, n) if r1.color else _single(rng, r1, n)
    r2, link = parse_ref(m.group("p2")), m.group("link")
    if link == "and":
        return _logic("and")(rng, {"p1": m.group("p1"), "p2": m.group("p2")}, n)
    axis, before = RELATIONS[link]

    def make(r, yes: bool):
        a, b = fill(r, r1, avoid=[r2]), fill(r, r2, avoid=[r1])
        if not yes and r.random() < 0.3:  # one of the two missing instead of swapped
            b = near_miss(r, r2, avoid=[r1])
        first_a = before == yes
        objs = distractors(r, r.integers(0, 2), avoid=[r1, r2])
        if r.random() < 0.5:  # as a relation, the way a caption says it
            return Scene([a, b, *objs], relation=(link if yes else _OPPOSITE[link]))
        return Scene([a, b, *objs] if first_a else [b, a, *objs], order=axis)

    return _binary(rng, n, lambda r: make(r, True), lambda r: make(r, False))


_OPPOSITE = {
    "to the left of": "to the right of",
    "to the right of": "to the left of",
    "above": "below",
    "below": "above",
}


def _single(rng, ref: Ref, n):
    yes = lambda r: Scene([fill(r, ref)] + distractors(r, r.integers(0, 3)))  # noqa: E731
    no = lambda r: Scene([near_miss(r, ref)] + distractors(r, r.integers(0, 3), avoid=[ref]))  # noqa: E731
    return _binary(rng, n, yes, no)


@dataclass(frozen=True)
class Template:
    family: str
    pattern: re.Pattern
    write: Writer


def _t(family: str, pattern: str, write: Writer) -> Template:
    return Template(family, re.compile(f"^{pattern}$"), write)


TEMPLATES: tuple[Template, ...] = (
    _t("exist", rf"is there an? (?P<color>{_C}) (?P<shape>{_S})", exist),
    _t("count", rf"how many (?P<noun>{_PLURAL}) are there", count),
    _t("query_color", rf"what color is the (?P<ref>{_REF})", _query_attr("color")),
    _t("query_shape", rf"what shape is the (?P<ref>{_REF})", _query_attr("shape")),
    _t("query_size", rf"what size is the (?P<ref>{_REF})", _query_attr("size")),
    _t("relate_query", rf"what color is the (?P<shape>{_S}) (?P<rel>{_REL}) the (?P<ref>{_REF})", relate_query),
    _t("relate_exist", rf"is there an? (?P<color>{_C}) object (?P<rel>{_REL}) the (?P<ref>{_REF})", relate_exist),
    _t("same_color", rf"do the (?P<r1>{_REF}) and the (?P<r2>{_REF}) have the same color", _same("color")),
    _t("same_shape", rf"are the (?P<r1>{_REF}) and the (?P<r2>{_REF}) the same shape", _same("shape")),
    _t("choose_color", rf"is the (?P<ref>{_REF}) (?P<a>{_C}) or (?P<b>{_C})", _choose("color")),
    _t("choose_shape", rf"is the (?P<ref>{_REF}) an? (?P<a>{_S}) or an? (?P<b>{_S})", _choose("shape")),
    _t("verify_color", rf"is the (?P<ref>{_REF}) (?P<color>{_C})", verify_color),
    _t("logic_and", rf"is there both an? (?P<p1>{_PHRASE}) and an? (?P<p2>{_PHRASE})", _logic("and")),
    _t("logic_or", rf"is there either an? (?P<p1>{_PHRASE}) or an? (?P<p2>{_PHRASE})", _logic("or")),
    _t("position_vertical", rf"is the (?P<ref>{_REF}) in the top or bottom half of the image", _position("y")),
    _t("position_horizontal", rf"is the (?P<ref>{_REF}) on the left or right side of the image", _position("x")),
    _t("superlative_size", rf"what color is the (?P<word>largest|smallest) (?P<noun>{_S}|object)", superlative_size),
    _t(
        "superlative_position",
        rf"what shape is the (?P<word>leftmost|rightmost|topmost|bottommost) (?:(?P<color>{_C}) )?object",
        superlative_position,
    ),
    _t("compare_count", rf"are there more (?P<p1>{_PLURAL}) than (?P<p2>{_PLURAL})", compare_count),
)


def match_template(query: str) -> tuple[str, Writer, dict[str, str]] | None:
    """The family a query belongs to, its writer and its slots; None when no template matches."""
    m = _ITM.match(query.strip())
    if m is not None:
        return "itm", itm, {"caption": m.group("caption")}
    text = " ".join(query.lower().strip().rstrip("?").split())
    for t in TEMPLATES:
        m = t.pattern.match(text)
        if m is not None:
            return t.family, t.write, {k: v for k, v in m.groupdict().items() if v is not None}
    return None


@register_writer("shapes_rules")
class ShapesRuleWriter:
    """Rule-based (not an LLM) test writer for the shapes world's query templates."""

    VERSION = 1  # bump when the rules change what tests a query gets
    sees_program = False  # query-only, like ViUniT's query-only prompt

    def __init__(self, num_candidates: int = 10, seed: int = 0):
        if num_candidates < 1:
            raise ValueError(f"num_candidates must be >= 1, got {num_candidates}")
        self.num_candidates, self.seed = int(num_candidates), int(seed)
        self.config_key = f"shapes_rules/v{self.VERSION}/n{self.num_candidates}/s{self.seed}"
        self.warnings: Counter = Counter()

    def write(self, queries: Sequence[str], programs: Sequence[str] | None = None) -> list[list[UnitTest]]:
        return [self.write_one(q) for q in queries]

    def write_one(self, query: str) -> list[UnitTest]:
        found = match_template(query)
        if found is None:
            self.warnings["unrecognised_query"] += 1
            return []
        _family, write, slots = found
        digest = hashlib.sha256(f"{self.seed}\x00{query}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        try:
            scenes = write(rng, slots, self.num_candidates)
        except ImpossibleScene:
            self.warnings["impossible_query"] += 1  # e.g. "the circle left of the circle"
            return []
        tests, seen = [], set()
        for scene, answer in scenes:
            test = UnitTest(describe(rng, scene), answer)
            if (test.caption.lower(), test.answer) not in seen:
                seen.add((test.caption.lower(), test.answer))
                tests.append(test)
        if not tests:
            self.warnings["unrecognised_query"] += 1
        return tests


__all__ = ["TEMPLATES", "ShapesRuleWriter", "match_template"]
