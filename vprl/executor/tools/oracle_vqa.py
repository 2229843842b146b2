"""`simple_query` answered from a scene graph: GQA's common question forms, in the words a person uses.

A VQA model always answers, so does this: a question it cannot read from the graph gets
"unknown" (and a region with no object in it "nothing"), never an error the program would be
blamed for. The forms, in the order they are tried:

=========== ====================================================== ==================================
kind        examples                                               answer
=========== ====================================================== ==================================
count       How many buses are there? How many people are on ...? the number of objects named
exists      Is there a bus stop? Are there both cups and plates?  yes / no
attribute   What color is the car? What is the bench made of?     the object's attribute of that kind
action      What is the man doing?                                 its activity attributes ("-ing")
side        Is the cat on the left or on the right?                left / right
compare     Are the cup and the plate the same color?              yes / no
choose      Is the shirt red or blue? Is this a cat or a dog?      the option that holds
verify      Is the shirt light blue? Is the cup on the table?      yes / no
where       Where is the cat?                                      what it is on / in / at
relation    What is in front of the horse? What is he holding?     the related object's name
category    What animal is this? Who is sitting on the bench?      the name of the object of that kind
=========== ====================================================== ==================================
"""

from __future__ import annotations

import re
from collections.abc import Callable

from vprl.executor.tools.lexicon import attribute_kind, category, covers
from vprl.executor.tools.oracle_scene import DEICTIC, SceneObject, View, strip_fillers, tokens
from vprl.executor.tools.phrases import GENERIC, attribute_phrases, covered, norm_attr, words

UNKNOWN = "unknown"
NOTHING = "nothing"  # the region holds no object at all

_KIND = r"(?P<kind>color|material|shape|size)"
_PLACES = ("image", "picture", "photo", "photograph", "scene")
_LEFT, _RIGHT = ("to", "the", "left", "of"), ("to", "the", "right", "of")


def answer(view: View, question: str) -> str:
    q = " ".join(tokens(question))
    for pattern, handler in _RULES:
        m = pattern.match(q)
        if m:
            out = handler(view, {k: (v or "").split() for k, v in m.groupdict().items()})
            if out is not None:
                return out
    return UNKNOWN


# -- helpers -----------------------------------------------------------------------------------
def _target(view: View, words: list[str]) -> SceneObject | None:
    """The object a question names; the region's main object when it names none (or none is
    found: a VQA model answers about what it sees)."""
    words = strip_fillers(words)
    if not words or all(w in DEICTIC for w in words):
        return view.main()
    return view.main(view.resolve(words))


def _values(obj: SceneObject, kind: str) -> list[str]:
    """The object's attributes of `kind`, in the graph's order; a shape is else its name (the
    shapes world names objects by their shape)."""
    found = [a for a in obj.ordered_attributes() if attribute_kind(a) == kind]
    return found or ([obj.name] if kind == "shape" else [])


def _value(obj: SceneObject, kind: str) -> str:
    return next(iter(_values(obj, kind)), UNKNOWN)


def _is_attribute(words: list[str], known: frozenset[str]) -> bool:
    """Do the words make attributes the region holds, or one of a kind the lexicon knows?"""
    return covered(words, known) or attribute_kind(norm_attr(" ".join(words))) is not None


def _name(view: View, candidates: list[SceneObject]) -> str | None:
    best = view.main(candidates) if candidates else None
    return best.name if best is not None else None


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _side(view: View, obj: SceneObject, anchors: list[SceneObject]) -> str:
    """left / right of the anchors (the graph's relation first, else the boxes' centres), or of
    the region's centre when there is no anchor."""
    if any(view.holds(obj, _LEFT, a) for a in anchors):
        return "left"
    if any(view.holds(obj, _RIGHT, a) for a in anchors):
        return "right"
    if anchors:
        centre = sum(a.x0 + a.x1 for a in anchors) / (2 * len(anchors))
    else:
        centre = (view.region[0] + view.region[2]) / 2
    return "left" if (obj.x0 + obj.x1) / 2 < centre else "right"


# -- the forms ---------------------------------------------------------------------------------
def _count(view: View, g: dict) -> str:
    return str(len(view.resolve(g["x"])))


def _exists(view: View, g: dict) -> str:
    phrase, joint, combine = g["x"], "and", all
    if phrase[:1] == ["both"]:
        phrase = phrase[1:]
    elif phrase[:1] == ["either"]:
        phrase, joint, combine = phrase[1:], "or", any
    elif "or" in phrase:
        joint, combine = "or", any
    return _yes(combine(bool(view.resolve(part)) for part in _split(phrase, joint)))


def _split(phrase: list[str], joint: str) -> list[list[str]]:
    parts, current = [], []
    for w in phrase:
        if w == joint:
            parts.append(current)
            current = []
        else:
            current.append(w)
    return [p for p in [*parts, current] if p]


def _attribute(view: View, g: dict) -> str:
    obj = _target(view, g.get("x", []))
    return NOTHING if obj is None else _value(obj, g["kind"][0])


def _material(view: View, g: dict) -> str:
    return _attribute(view, {**g, "kind": ["material"]})


def _size(view: View, g: dict) -> str:
    return _attribute(view, {**g, "kind": ["size"]})


def _action(view: View, g: dict) -> str:
    obj = _target(view, g["x"])
    if obj is None:
        return NOTHING
    # GQA writes activities as gerund attributes ("standing", "looking").
    return " and ".join(sorted(a for a in obj.attributes if len(a) > 4 and a.endswith("ing"))) or NOTHING


def _side_choice(view: View, g: dict) -> str:
    obj = _target(view, g["x"])
    if obj is None:
        return NOTHING
    # "... or right of the dog" has an anchor; "... or right of the picture" is the region itself.
    anchor = strip_fillers(g.get("y", []))
    anchors = view.resolve(anchor) if anchor and anchor[-1] not in _PLACES else []
    return _side(view, obj, anchors)


def _compare(view: View, g: dict) -> str:
    a, b = _target(view, g["x"]), _target(view, g["y"])
    if a is None or b is None:
        return NOTHING
    kind = g["kind"][0]
    return _yes(bool(set(_values(a, kind)) & set(_values(b, kind))))


def _choose(view: View, g: dict) -> str | None:
    left, option_b = g["left"], [w for w in g["b"] if w not in ("a", "an", "the")]
    if not option_b:
        return None
    # The first option is as many of the words before "or" as make an attribute of the second
    # option's kind ("light blue or white"), else as many words as the second option has.
    kind = attribute_kind(norm_attr(" ".join(option_b)))
    n = len(option_b)
    if kind is not None:
        n = next((k for k in (3, 2, 1) if k < len(left) and attribute_kind(norm_attr(" ".join(left[-k:]))) == kind), n)
    if n >= len(left):
        return None
    option_a, subject = left[-n:], left[:-n]
    while subject and subject[-1] in ("a", "an", "look", "looks"):
        subject = subject[:-1]
    obj = _target(view, subject)
    if obj is None:
        return NOTHING
    for option in (option_a, option_b):
        if view.has(obj, option):
            return " ".join(option)
    # Neither holds: a VQA model names what it sees, when the options say what to look at.
    return _value(obj, kind) if kind is not None else UNKNOWN


def _verify(view: View, g: dict) -> str:
    rest = g["rest"]
    split = view.split(rest)
    if split is not None:  # "Is the cup on the table?"
        xs, rel, ys = split
        return _yes(any(view.holds(x, rel, y) for x in xs for y in ys))
    for k in range(len(rest) - 1, 0, -1):  # "Is this a dog?", "Is the animal a horse?"
        if rest[k] in ("a", "an"):
            obj = _target(view, rest[:k])
            return NOTHING if obj is None else _yes(view.has(obj, rest[k + 1 :]))
    # "Is the shirt light blue?": the longest ending that is an attribute is the property.
    known = frozenset(p for o in view.visible for p in attribute_phrases(o.attributes))
    n = next((n for n in range(min(4, len(rest) - 1), 0, -1) if _is_attribute(rest[-n:], known)), 1)
    subject = rest[:-n]
    while subject and subject[-1] in ("look", "looks", "made", "of"):
        subject = subject[:-1]
    obj = _target(view, subject)
    return NOTHING if obj is None else _yes(view.has(obj, rest[-n:]))


def _where(view: View, g: dict) -> str:
    xs = view.resolve(g["x"])
    places = [r for r in view.relation_phrases if r[-1] in ("on", "in", "at", "inside")]
    for rel in places:
        found = _name(view, view.objects_of(xs, rel))
        if found is not None:
            return found
    return UNKNOWN


def _wh(view: View, g: dict) -> str | None:
    rest = g["rest"]
    if rest[:2] in (["kind", "of"], ["type", "of"], ["sort", "of"]):
        rest = rest[2:]
    verb = next((i for i, w in enumerate(rest) if w in ("is", "are")), None)
    if verb is None:
        return None
    kind_words, body = rest[:verb], view.verbs(rest[verb + 1 :])
    cat = "person" if g["wh"] == ["who"] else None
    if kind_words and kind_words[-1] not in GENERIC:
        cat = category(tuple(kind_words))
        if cat is None:
            return None

    def fits(objs: list[SceneObject]) -> list[SceneObject]:
        return [o for o in objs if cat is None or covers(cat, tuple(words(o.name)))]

    stripped = strip_fillers(body)
    if not stripped or all(w in DEICTIC for w in stripped) or (len(body) == 3 and body[-1] in _PLACES):
        return _name(view, fits(view.visible)) or NOTHING
    for rel in view.relation_phrases:
        n = len(rel)
        if tuple(body[:n]) == rel and len(body) > n:
            ys = view.resolve(body[n:])
            if ys:
                return _name(view, fits(view.subjects(rel, ys))) or UNKNOWN
        if tuple(body[-n:]) == rel and len(body) > n:
            xs = view.resolve(body[:-n])
            if xs:
                return _name(view, fits(view.objects_of(xs, rel))) or UNKNOWN
    named = fits(view.resolve(body))
    if named:
        return _name(view, named)
    described = [o for o in fits(view.visible) if covered(stripped, attribute_phrases(o.attributes))]
    return _name(view, described)


_Handler = Callable[[View, dict], "str | None"]
_RULES: tuple[tuple[re.Pattern, _Handler], ...] = tuple(
    (re.compile(pattern), handler)
    for pattern, handler in (
        (
            r"^how many (?P<x>.+?)(?: (?:are|is) there| can you see| do you see| are (?:visible|shown|pictured))?$",
            _count,
        ),
        (r"^(?:is|are) there (?P<x>.+)$", _exists),
        (r"^(?:do|can) you see (?P<x>.+)$", _exists),
        (rf"^(?:what|which) {_KIND} (?:is|are) (?P<x>.+?)(?: made of)?$", _attribute),
        (rf"^what is the {_KIND} of (?P<x>.+)$", _attribute),
        (rf"^what is the {_KIND}$", _attribute),
        (rf"^what is (?P<x>.+) 's {_KIND}$", _attribute),
        (rf"^(?P<x>.+) (?:is|are) (?:of )?what {_KIND}$", _attribute),
        (rf"^what {_KIND} (?:does|do) (?P<x>.+?) have$", _attribute),
        (r"^what (?:is|are) (?P<x>.+?) made (?:of|from)$", _material),
        (r"^how (?:big|large|small) (?:is|are) (?P<x>.+)$", _size),
        (r"^what (?:is|are) (?P<x>.+?) doing$", _action),
        (
            r"^(?:is|are) (?P<x>.+?) (?:on|to|at) the (?:left|right) or (?:on |to |at )?(?:the )?(?:left|right)"
            r"(?: side)?(?: of (?P<y>.+))?$",
            _side_choice,
        ),
        (r"^(?:on )?which side (?:of the [a-z]+ )?(?:is|are) (?P<x>.+?)(?: on)?$", _side_choice),
        (rf"^(?:are|is|do|does) (?P<x>.+?) and (?P<y>.+?) (?:have )?the same {_KIND}$", _compare),
        (rf"^(?:is|are|does|do) (?P<x>.+?) (?:have )?the same {_KIND} as (?P<y>.+)$", _compare),
        (r"^(?:is|are|does|do) (?P<left>.+) or (?P<b>.+)$", _choose),
        (r"^(?:is|are|does|do|was|were|can) (?P<rest>.+)$", _verify),
        (r"^where (?:is|are) (?P<x>.+)$", _where),
        (r"^(?P<wh>what|which|who) (?P<rest>.+)$", _wh),
    )
)
