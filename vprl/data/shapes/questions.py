"""VQA question families of the shapes world, each with its gold program.

Every family samples a question that the scene answers unambiguously (a "the X" phrase is used
only when exactly one object fits it), the answer computed from the scene, and a gold program
filled from the same slots. The program's comparisons are the ones the truth is computed with,
on the same integer boxes, in the API's bottom-left convention ("above" = larger
`vertical_center`). Comparisons that decide an answer also keep a margin of a few pixels, so a
tool that finds boxes a little off can still get them right.

Families are split: `TRAIN_FAMILIES` for training and in-family evaluation, `HELDOUT_FAMILIES`
for cross-family generalisation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vprl.data.shapes.references import (
    ANY_REF,
    EXTREMES,
    NO_COLOR,
    NO_SHAPE,
    RELATIONS,
    clears_margin,
    pick,
    plural,
    program,
    select,
    unique_ref,
)
from vprl.data.shapes.scene import COLORS, SHAPES, Scene, ShapeObject


@dataclass(frozen=True)
class QA:
    family: str
    question: str
    answer: str
    program: str


@dataclass(frozen=True)
class Family:
    name: str
    structural: str  # GQA's structural type: verify | query | choose | logical | compare
    semantic: str  # GQA's semantic type: obj | attr | rel | global
    sample: Callable[[Scene, np.random.Generator], QA | None]


# -- families ------------------------------------------------------------------------------------
def exist(scene: Scene, rng) -> QA | None:
    objs = scene.objects
    if rng.random() < 0.5:
        o = pick(rng, objs)
        color, shape = o.color, o.shape
    else:
        absent = [(c, s) for c in COLORS for s in SHAPES if not select(objs, color=c, shape=s)]
        color, shape = pick(rng, absent)
    phrase = f"{color} {shape}"
    answer = "yes" if select(objs, color=color, shape=shape) else "no"
    return QA(
        "exist", f"Is there a {phrase}?", answer, program(f'return bool_to_yesno(image_patch.exists("{phrase}"))')
    )


def count(scene: Scene, rng) -> QA | None:
    o = pick(rng, scene.objects)
    mode = pick(rng, (("color",), ("shape",), ("color", "shape")))
    parts = {k: getattr(o, k) for k in mode}
    if rng.random() < 0.2:  # sometimes a kind that may be absent, so 0 is an answer too
        parts = {"color": pick(rng, COLORS), "shape": pick(rng, SHAPES)}
    noun = plural(parts)
    n = len(select(scene.objects, **parts))
    return QA("count", f"How many {noun} are there?", str(n), program(f'return str(len(image_patch.find("{noun}")))'))


def _query_attr(family: str, attr: str, options) -> Callable[[Scene, np.random.Generator], QA | None]:
    def sample(scene: Scene, rng) -> QA | None:
        o = pick(rng, scene.objects)
        ref = unique_ref(o, scene.objects, options)
        if ref is None:
            return None
        question = f"What {attr} is the {ref}?"
        lines = (f'obj = image_patch.find("{ref}")[0]', f'return obj.simple_query("{question}")')
        return QA(family, question, getattr(o, attr), program(*lines))

    return sample


query_color = _query_attr("query_color", "color", NO_COLOR)
query_shape = _query_attr("query_shape", "shape", NO_SHAPE)
query_size = _query_attr("query_size", "size", (("color", "shape"),))


def verify_color(scene: Scene, rng) -> QA | None:
    o = pick(rng, scene.objects)
    ref = unique_ref(o, scene.objects, NO_COLOR)
    if ref is None:
        return None
    color = o.color if rng.random() < 0.5 else pick(rng, [c for c in COLORS if c != o.color])
    lines = (f'obj = image_patch.find("{ref}")[0]', f'return bool_to_yesno(obj.verify_property("{ref}", "{color}"))')
    return QA("verify_color", f"Is the {ref} {color}?", "yes" if color == o.color else "no", program(*lines))


def relate_query(scene: Scene, rng) -> QA | None:
    anchor, target = (pick(rng, scene.objects), pick(rng, scene.objects))
    if anchor is target:
        return None
    ref = unique_ref(anchor, scene.objects, ANY_REF)
    rel = pick(rng, RELATIONS)
    truth, cond = RELATIONS[rel]
    same = [o for o in select(scene.objects, shape=target.shape) if o is not anchor]
    sides = [truth(o, anchor, scene.height) for o in same]
    if (
        ref is None
        or not all(clears_margin(v) for v in sides)
        or [o for o, v in zip(same, sides) if v > 0] != [target]
    ):
        return None
    lines = (
        f'anchor = image_patch.find("{ref}")[0]',
        f'candidates = [p for p in image_patch.find("{target.shape}") if {cond}]',
        f'return candidates[0].simple_query("What color is the {target.shape}?")',
    )
    return QA("relate_query", f"What color is the {target.shape} {rel} the {ref}?", target.color, program(*lines))


def relate_exist(scene: Scene, rng) -> QA | None:
    anchor = pick(rng, scene.objects)
    ref = unique_ref(anchor, scene.objects, ANY_REF)
    rel = pick(rng, RELATIONS)
    truth, cond = RELATIONS[rel]
    others = [o for o in scene.objects if o is not anchor]
    if rng.random() < 0.5 and others:
        color = pick(rng, others).color
    else:
        color = pick(rng, COLORS)
    same = [o for o in others if o.color == color]
    sides = [truth(o, anchor, scene.height) for o in same]
    if ref is None or not all(clears_margin(v) for v in sides):
        return None
    lines = (
        f'anchor = image_patch.find("{ref}")[0]',
        f'return bool_to_yesno(any({cond} for p in image_patch.find("{color} object")))',
    )
    answer = "yes" if any(v > 0 for v in sides) else "no"
    return QA("relate_exist", f"Is there a {color} object {rel} the {ref}?", answer, program(*lines))


def _same(family: str, attr: str, options, wording: str):
    def sample(scene: Scene, rng) -> QA | None:
        if len(scene.objects) < 2:
            return None
        want_same = rng.random() < 0.5
        pairs = [
            (a, b)
            for a in scene.objects
            for b in scene.objects
            if a is not b and (getattr(a, attr) == getattr(b, attr)) == want_same
        ]
        a, b = pick(rng, pairs) or (None, None)
        if a is None:
            return None
        r1, r2 = unique_ref(a, scene.objects, options), unique_ref(b, scene.objects, options)
        if r1 is None or r2 is None:
            return None
        lines = (
            f'first = image_patch.find("{r1}")[0]',
            f'second = image_patch.find("{r2}")[0]',
            f'return bool_to_yesno(first.simple_query("What {attr} is the {r1}?") == '
            f'second.simple_query("What {attr} is the {r2}?"))',
        )
        answer = "yes" if getattr(a, attr) == getattr(b, attr) else "no"
        return QA(family, wording.format(r1=r1, r2=r2), answer, program(*lines))

    return sample


same_color = _same("same_color", "color", NO_COLOR, "Do the {r1} and the {r2} have the same color?")
same_shape = _same("same_shape", "shape", NO_SHAPE, "Are the {r1} and the {r2} the same shape?")


def _choose(family: str, attr: str, options, vocab, wording: str):
    def sample(scene: Scene, rng) -> QA | None:
        o = pick(rng, scene.objects)
        ref = unique_ref(o, scene.objects, options)
        if ref is None:
            return None
        right = getattr(o, attr)
        wrong = pick(rng, [v for v in vocab if v != right])
        first, second = (right, wrong) if rng.random() < 0.5 else (wrong, right)
        lines = (f'obj = image_patch.find("{ref}")[0]', f'return obj.best_text_match(["{first}", "{second}"])')
        return QA(family, wording.format(ref=ref, a=first, b=second), right, program(*lines))

    return sample


choose_color = _choose("choose_color", "color", NO_COLOR, COLORS, "Is the {ref} {a} or {b}?")
choose_shape = _choose("choose_shape", "shape", NO_SHAPE, SHAPES, "Is the {ref} a {a} or a {b}?")


def _two_phrases(scene: Scene, rng, present: tuple[bool, bool]) -> tuple[str, str] | None:
    phrases = []
    for want in present:
        if want:
            o = pick(rng, scene.objects)
            phrases.append(f"{o.color} {o.shape}")
        else:
            absent = [f"{c} {s}" for c in COLORS for s in SHAPES if not select(scene.objects, color=c, shape=s)]
            phrases.append(pick(rng, absent))
    return None if phrases[0] == phrases[1] else (phrases[0], phrases[1])


def _logic(family: str, presences, joiner: str, wording: str, combine: Callable[[tuple[bool, bool]], bool]):
    def sample(scene: Scene, rng) -> QA | None:
        present = pick(rng, presences)
        pair = _two_phrases(scene, rng, present)
        if pair is None:
            return None
        p1, p2 = pair
        line = f'return bool_to_yesno(image_patch.exists("{p1}") {joiner} image_patch.exists("{p2}"))'
        return QA(family, wording.format(p1, p2), "yes" if combine(present) else "no", program(line))

    return sample


# Presence patterns are weighted so that both answers stay common.
logic_and = _logic(
    "logic_and", ((True, True), (True, True), (True, False), (False, True)), "and", "Is there both a {} and a {}?", all
)
logic_or = _logic(
    "logic_or",
    ((False, False), (False, False), (True, False), (False, True)),
    "or",
    "Is there either a {} or a {}?",
    any,
)


def _position(
    name: str,
    center: str,
    offset: Callable[[ShapeObject, Scene], float],
    sign: int,
    words: tuple[str, str],
    wording: str,
):
    """A family asking which half of the image an object is in, along one axis. `offset` is how far
    the object's centre lies from the image's (positive = up or right); the answer is `words[0]`
    when `sign * offset > 0`, and the gold program makes the same comparison on `center`."""
    comparison = ">" if sign > 0 else "<"

    def sample(scene: Scene, rng) -> QA | None:
        o = pick(rng, scene.objects)
        ref = unique_ref(o, scene.objects, ANY_REF)
        distance = offset(o, scene)
        if ref is None or not clears_margin(distance):
            return None
        lines = (
            f'obj = image_patch.find("{ref}")[0]',
            f'return "{words[0]}" if obj.{center} {comparison} image_patch.{center} else "{words[1]}"',
        )
        answer = words[0] if sign * distance > 0 else words[1]
        return QA(name, wording.format(ref), answer, program(*lines))

    return sample


position_vertical = _position(
    "position_vertical",
    "vertical_center",
    lambda o, scene: o.vertical_center(scene.height) - scene.height / 2,
    +1,
    ("top", "bottom"),
    "Is the {} in the top or bottom half of the image?",
)
position_horizontal = _position(
    "position_horizontal",
    "horizontal_center",
    lambda o, scene: o.horizontal_center - scene.width / 2,
    -1,
    ("left", "right"),
    "Is the {} on the left or right side of the image?",
)


def superlative_size(scene: Scene, rng) -> QA | None:
    noun = pick(rng, ["object", *sorted({o.shape for o in scene.objects})])
    group = [o for o in scene.objects if noun == "object" or o.shape == noun]
    word, extreme = pick(rng, (("largest", max), ("smallest", min)))
    if len(group) < 2:
        return None
    areas = sorted(o.area for o in group)
    if (extreme is max and areas[-1] < 1.2 * areas[-2]) or (extreme is min and areas[1] < 1.2 * areas[0]):
        return None
    o = extreme(group, key=lambda x: x.area)
    lines = (
        f'obj = {extreme.__name__}(image_patch.find("{noun}"), key=lambda p: p.area)',
        f'return obj.simple_query("What color is the {noun}?")',
    )
    return QA("superlative_size", f"What color is the {word} {noun}?", o.color, program(*lines))


def superlative_position(scene: Scene, rng) -> QA | None:
    color = pick(rng, [None, *sorted({o.color for o in scene.objects})])
    group = select(scene.objects, color=color)
    word = pick(rng, EXTREMES)
    key, fn, expr = EXTREMES[word]
    if len(group) < 2:
        return None
    ranked = sorted(group, key=lambda o: key(o, scene.height), reverse=True)
    if not clears_margin(key(ranked[0], scene.height) - key(ranked[1], scene.height)):
        return None
    noun = f"{color} object" if color else "object"
    lines = (
        f'obj = {fn}(image_patch.find("{noun}"), key=lambda p: {expr})',
        'return obj.simple_query("What shape is this?")',
    )
    return QA("superlative_position", f"What shape is the {word} {noun}?", ranked[0].shape, program(*lines))


def compare_count(scene: Scene, rng) -> QA | None:
    kinds = [{"shape": s} for s in SHAPES] + [{"color": c} for c in sorted({o.color for o in scene.objects})]
    a, b = pick(rng, kinds), pick(rng, kinds)
    if a == b:
        return None
    n1, n2 = len(select(scene.objects, **a)), len(select(scene.objects, **b))
    p1, p2 = plural(a), plural(b)
    line = f'return bool_to_yesno(len(image_patch.find("{p1}")) > len(image_patch.find("{p2}")))'
    return QA("compare_count", f"Are there more {p1} than {p2}?", "yes" if n1 > n2 else "no", program(line))


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("exist", "verify", "obj", exist),
        Family("count", "query", "obj", count),
        Family("query_color", "query", "attr", query_color),
        Family("query_shape", "query", "attr", query_shape),
        Family("query_size", "query", "attr", query_size),
        Family("verify_color", "verify", "attr", verify_color),
        Family("relate_query", "query", "rel", relate_query),
        Family("relate_exist", "verify", "rel", relate_exist),
        Family("same_color", "compare", "attr", same_color),
        Family("same_shape", "compare", "attr", same_shape),
        Family("choose_color", "choose", "attr", choose_color),
        Family("choose_shape", "choose", "attr", choose_shape),
        Family("logic_and", "logical", "obj", logic_and),
        Family("logic_or", "logical", "obj", logic_or),
        Family("position_vertical", "choose", "global", position_vertical),
        Family("position_horizontal", "choose", "global", position_horizontal),
        Family("superlative_size", "query", "attr", superlative_size),
        Family("superlative_position", "query", "rel", superlative_position),
        Family("compare_count", "compare", "obj", compare_count),
    )
}
HELDOUT_FAMILIES = (
    "relate_exist",
    "same_shape",
    "choose_shape",
    "logic_or",
    "position_horizontal",
    "superlative_position",
    "compare_count",
)
TRAIN_FAMILIES = tuple(f for f in FAMILIES if f not in HELDOUT_FAMILIES)


def sample_questions(scene: Scene, rng: np.random.Generator, families: tuple[str, ...], n: int) -> list[QA]:
    """Up to `n` distinct questions about the scene, families visited in a shuffled cycle."""
    order = [families[i] for i in rng.permutation(len(families))]
    out: list[QA] = []
    seen: set[str] = set()
    for attempt in range(n * 4):
        family = FAMILIES[order[attempt % len(order)]]
        # A family whose draw fails gets a few more draws, so rare families are not starved.
        qa = next((q for q in (family.sample(scene, rng) for _ in range(4)) if q is not None), None)
        if qa is not None and qa.question not in seen:
            seen.add(qa.question)
            out.append(qa)
            if len(out) == n:
                break
    return out
