"""Scene writers for the shapes world's question families: what the rule-based test writer imagines.

One writer per family of `vprl/data/shapes/questions.py` (and `itm` for image-text captions): given a
seeded generator, the slots its query template matched and a count, it returns that many
`(Scene, expected answer)` pairs, alternating answers where the family allows, with distractors and
near-misses (the queried kind in the wrong colour, on the other side, one too many). The template
table that picks a writer for a query is `vprl/rewards/unit_tests/rule_writer.py`; the regex fragments
here are shared with it. A query that cannot be drawn raises `ImpossibleScene`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from vprl.data.shapes.scene import COLORS, SHAPES, SIZES
from vprl.rewards.unit_tests.scene_text import (
    COLOR_PATTERN,
    SHAPE_PATTERN,
    Ref,
    Scene,
    distractors,
    fill,
    near_miss,
    other,
    parse_plural,
    parse_ref,
)

PHRASE_PATTERN = rf"(?:(?:{COLOR_PATTERN}) )?(?:{SHAPE_PATTERN})"  # "[colour] shape", as captions say it

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


def query_attr(attr: str):
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


def choose(attr: str):
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


def same(attr: str):
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


def logic(op: str):
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


def position(axis: str):
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
RELATION_PATTERN = "|".join(RELATIONS)


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
_CAPTION = re.compile(
    rf"^an? (?P<p1>{PHRASE_PATTERN})(?: (?P<link>and|{RELATION_PATTERN}) an? (?P<p2>{PHRASE_PATTERN}))?$"
)


def itm(rng, slots, n):
    m = _CAPTION.match(slots["caption"].strip().lower().rstrip("."))
    if m is None:
        return []
    r1 = parse_ref(m.group("p1"))
    if m.group("p2") is None:
        return exist(rng, {"color": r1.color, "shape": r1.shape}, n) if r1.color else _single(rng, r1, n)
    r2, link = parse_ref(m.group("p2")), m.group("link")
    if link == "and":
        return logic("and")(rng, {"p1": m.group("p1"), "p2": m.group("p2")}, n)
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


__all__ = [
    "PHRASE_PATTERN",
    "RELATION_PATTERN",
    "Writer",
    "choose",
    "compare_count",
    "count",
    "exist",
    "itm",
    "logic",
    "position",
    "query_attr",
    "relate_exist",
    "relate_query",
    "same",
    "superlative_position",
    "superlative_size",
    "verify_color",
]
