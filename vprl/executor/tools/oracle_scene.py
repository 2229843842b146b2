"""The objects of a scene graph as one tool call sees them, and the phrases that pick them out.

A `View` is a scene seen through a region (the patch a program calls a tool on). It resolves
referring expressions against what the graph holds: "the bus stop" (a name), "the light blue
shirt" (attributes), "the person" (a broader name), "the cup on the table" (a relation the graph
lists), "the man's shirt" (something attached to the man). docs/oracle.md has the rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vprl.data.boxes import intersection_area
from vprl.executor.tools.inflection import participle
from vprl.executor.tools.lexicon import EXACT, INFLECTED, LEXICON, canonical, inverse, synonyms
from vprl.executor.tools.phrases import ARTICLES, attribute_phrases, covered, norm_attr, parse_noun_phrase

# Words around a phrase that name no object: "the cup that is on ...", "the dogs in the picture".
_LINKS = frozenset({"that", "which", "who", "is", "are"})
_FILLERS = (
    ("in", "the", "image"),
    ("in", "the", "picture"),
    ("in", "the", "photo"),
    ("in", "the", "photograph"),
    ("in", "the", "scene"),
    ("in", "this", "image"),
    ("in", "this", "picture"),
    ("in", "this", "photo"),
    ("there",),
    ("visible",),
    ("shown",),
    ("pictured",),
)
# Words meaning "the region itself" where a question names no object.
DEICTIC = frozenset({"this", "that", "it", "these", "those", "they", "there"})
# Relations every question may use though no graph names them: "the shirt of the man", "the man with
# the hat" hold when the two are attached (a relation either way, or one mostly inside the other).
_ATTACHING = (("of",), ("with",))
# Digits are words too: a name or a phrase may be a number ("17", a player's shirt).
_TOKEN = re.compile(r"[a-z0-9]+|'s")


@dataclass(frozen=True)
class SceneObject:
    id: str
    name: str
    x0: float
    y0: float
    x1: float
    y1: float  # top-left pixel box
    attributes: frozenset[str]
    # The graph's order of the attributes, for answers that name one ("What color ...?").
    attribute_order: tuple[str, ...] = ()
    # (relation name, object id) pairs, as the graph lists them on this object.
    relations: tuple[tuple[str, str], ...] = ()

    @property
    def area(self) -> float:
        return (self.x1 - self.x0) * (self.y1 - self.y0)

    def overlap(self, x0: float, y0: float, x1: float, y1: float) -> float:
        return intersection_area((self.x0, self.y0, self.x1, self.y1), (x0, y0, x1, y1))

    def ordered_attributes(self) -> tuple[str, ...]:
        return self.attribute_order or tuple(sorted(self.attributes))

    def inside(self, other: SceneObject, share: float = 0.5) -> bool:
        return self.area > 0 and other.overlap(self.x0, self.y0, self.x1, self.y1) >= share * self.area


def scene_objects(scene: dict) -> list[SceneObject]:
    """The objects of one GQA-format scene graph (`{"objects": {id: {...}}}`)."""
    out = []
    for oid, o in scene["objects"].items():
        order = tuple(dict.fromkeys(norm_attr(str(a)) for a in o.get("attributes", ())))
        relations = tuple((" ".join(tokens(str(r["name"]))), str(r["object"])) for r in o.get("relations", ()))
        name = " ".join(str(o["name"]).lower().split())
        box = (o["x"], o["y"], o["x"] + o["w"], o["y"] + o["h"])
        out.append(SceneObject(str(oid), name, *box, frozenset(order), order, relations))
    return out


def tokens(text: str) -> list[str]:
    """Lower-case words (letters or digits) of a question or phrase; a possessive "'s" is a word of
    its own."""
    text = text.lower().replace("\u2019", "'")
    text = re.sub(r"\b(what|who|where|that|it|there|how)'s\b", r"\1 is", text)
    return _TOKEN.findall(text.replace("colour", "color"))


def strip_fillers(words: list[str]) -> list[str]:
    words = list(words)
    while words and words[0] in ARTICLES:
        words = words[1:]
    changed = True
    while changed and words:
        changed = False
        for filler in _FILLERS:
            if len(words) > len(filler) and tuple(words[-len(filler) :]) == filler:
                words, changed = words[: -len(filler)], True
        while words and words[-1] in _LINKS:
            words, changed = words[:-1], True
    return words


def _iou(o: SceneObject, region: tuple[float, float, float, float]) -> float:
    inter = o.overlap(*region)
    union = o.area + (region[2] - region[0]) * (region[3] - region[1]) - inter
    return inter / union if union > 0 else 0.0


class View:
    """The scene seen through one region: `visible` objects have at least `min_visible` of their
    box inside it (what a detector run on the crop finds), `present` ones overlap it at all."""

    def __init__(self, objects: list[SceneObject], region: tuple[float, float, float, float], min_visible: float):
        self.objects = objects
        self.region = region
        self.visible = [o for o in objects if o.area > 0 and o.overlap(*region) >= min_visible * o.area]
        self.present = [o for o in objects if o.area > 0 and o.overlap(*region) > 0]
        names = {name for o in objects for name, _ in o.relations}
        self.relation_phrases = sorted(self._phrases(names), key=len, reverse=True)
        self._gerunds = {w for name in names for w in name.split() if w.endswith("ing")}

    @staticmethod
    def _phrases(names: set[str]) -> set[tuple[str, ...]]:
        """Relation wordings a question may use: the graph's names, their inverses, the prepositions
        they end with ("lying on" -> "on"), and the attaching words."""
        out = set(_ATTACHING)
        wordings = {s for n in names | {inverse(n) for n in names if inverse(n)} for s in synonyms(n)}
        for name in wordings:
            ws = tuple(name.split())
            out.add(ws)
            out.update(ws[i:] for i in range(1, len(ws)) if ws[i] in LEXICON.prepositions)
        return out

    def verbs(self, words: list[str]) -> list[str]:
        """The words with each verb in the "-ing" form the graph's relations use: "Does the man
        wear a hat?" asks about the relation "wearing"."""
        if not self._gerunds:
            return list(words)
        return [w if w in self._gerunds or participle(w) not in self._gerunds else participle(w) for w in words]

    # -- picking objects --------------------------------------------------------------------
    def main(self, candidates: list[SceneObject] | None = None) -> SceneObject | None:
        """The object a question about the region is about: of the candidates (else of what is
        visible), the one with the most of its box in the region."""
        return max(candidates or self.visible, key=lambda o: o.overlap(*self.region), default=None)

    def own(self, min_iou: float = 0.5) -> SceneObject | None:
        """The object whose box the region is (a patch `find` returned), if one fits it closely."""
        best = max(self.visible, key=lambda o: _iou(o, self.region), default=None)
        return best if best is not None and _iou(best, self.region) >= min_iou else None

    def select(self, words: list[str]) -> list[SceneObject]:
        """The objects a plain noun phrase names. Where the phrase's word is some object's own
        name, objects it names only by inflection drop out ("glasses" is not the drinking glass
        when the scene holds a pair of glasses); broader names stay ("person" keeps the men)."""
        numbers = {w for w in words if w.isdigit()}
        if numbers:
            return self._numbered(words, numbers)
        phrase = parse_noun_phrase(" ".join(words))
        scored = [(o, phrase.match(o.name, o.attributes)) for o in self.visible]
        scored = [(o, q) for o, q in scored if q]
        if any(q == EXACT for _, q in scored):
            scored = [(o, q) for o, q in scored if q != INFLECTED]
        return [o for o, _ in scored]

    def _numbered(self, words: list[str], numbers: set[str]) -> list[SceneObject]:
        """The objects a phrase holding numbers names ("17", "number 17", "the 17 bus"): each number
        must be a word of the object's name or of one of its attributes, and the other words a noun
        phrase for it. The noun-phrase reader knows letters only, and a phrase it reads as empty
        names every object."""
        found = [o for o in self.visible if numbers <= _numbers_of(o)]
        rest = strip_fillers([w for w in words if w not in numbers and w not in _NUMBER_WORDS])
        if not rest:
            return found
        phrase = parse_noun_phrase(" ".join(rest))
        return [o for o in found if phrase.matches(o.name, o.attributes)]

    def resolve(self, words: list[str]) -> list[SceneObject]:
        """The visible objects a referring expression names; [] when none (or it is not understood).

        A noun phrase first ("the red bus"), then "X's Y" (a Y attached to an X), then "X <relation>
        Y" with a relation the graph holds ("the cup on the table", "the boy in front of the horse")."""
        words = strip_fillers(words)
        if not words:
            return []
        plain = self.select(words)
        if plain:
            return plain
        if "'s" in words:
            k = words.index("'s")
            owners, things = self.resolve(words[:k]), self.resolve(words[k + 1 :])
            return [t for t in things if any(self.attached(t, o) for o in owners)]
        split = self.split(words)
        if split is None:
            return []
        xs, rel, ys = split
        return [x for x in xs if any(self.holds(x, rel, y) for y in ys)]

    def split(self, words: list[str]) -> tuple[list[SceneObject], tuple[str, ...], list[SceneObject]] | None:
        """The first reading of the words as "X <relation> Y" where both X and Y name visible
        objects: (xs, relation, ys), or None. The relation need not hold between them."""
        words = self.verbs(strip_fillers(words))
        for start in range(1, len(words)):
            for rel in self.relation_phrases:
                if tuple(words[start : start + len(rel)]) != rel:
                    continue
                subject = strip_fillers(words[:start])
                xs = self.select(subject) if subject else []
                ys = self.resolve(words[start + len(rel) :]) if xs else []
                if xs and ys:
                    return xs, rel, ys
        return None

    # -- relations --------------------------------------------------------------------------
    def holds(self, x: SceneObject, rel: tuple[str, ...], y: SceneObject) -> bool:
        """Does `x rel y` hold in the graph (listed on x, or its inverse listed on y)?"""
        if x.id == y.id:
            return False
        for name, target in x.relations:
            if target == y.id and _relation_matches(rel, name):
                return True
        back = inverse(" ".join(rel))
        if back is not None and any(t == x.id and canonical(name) == canonical(back) for name, t in y.relations):
            return True
        return rel in _ATTACHING and (self.attached(x, y) if rel == ("of",) else self.attached(y, x))

    def attached(self, part: SceneObject, whole: SceneObject) -> bool:
        """`part` belongs to `whole`: a relation between them either way, or mostly inside its box."""
        if any(t == whole.id for _, t in part.relations) or any(t == part.id for _, t in whole.relations):
            return True
        return part.inside(whole)

    def subjects(self, rel: tuple[str, ...], ys: list[SceneObject]) -> list[SceneObject]:
        """Objects in the region that stand in `rel` to one of `ys` ("what is on the table")."""
        return [s for s in self.present if s not in ys and any(self.holds(s, rel, y) for y in ys)]

    def objects_of(self, xs: list[SceneObject], rel: tuple[str, ...]) -> list[SceneObject]:
        """Objects in the region one of `xs` stands in `rel` to ("what is the man holding")."""
        return [y for y in self.present if y not in xs and any(self.holds(x, rel, y) for x in xs)]

    def has(self, obj: SceneObject, words: list[str]) -> bool:
        """Is the phrase an attribute of the object (whole attributes, "made of" dropped), or a
        name for it ("is this a dog", "is it an animal")?"""
        words = [w for w in words if w not in ("made", "of", "a", "an", "the")]
        if not words:
            return False
        if covered(words, attribute_phrases(obj.attributes) | {obj.name}):
            return True
        return parse_noun_phrase(" ".join(words)).matches(obj.name, obj.attributes)


# "number 17" names the 17 itself, whether the graph calls it "17" or a "number" that is 17.
_NUMBER_WORDS = frozenset({"number", "numbers", "no"})


def _numbers_of(obj: SceneObject) -> set[str]:
    return {w for text in (obj.name, *obj.attributes) for w in tokens(text) if w.isdigit()}


def _relation_matches(asked: tuple[str, ...], listed: str) -> bool:
    """The graph's relation `listed` answers a question's `asked`: the same words or a synonym
    ("under" for "below"), or `asked` is the preposition the listed relation ends with ("on" is
    answered by "lying on", "parked on")."""
    ws = tuple(listed.split())
    if ws == asked or canonical(listed) == canonical(" ".join(asked)):
        return True
    return len(asked) < len(ws) and ws[-len(asked) :] == asked and asked[0] in LEXICON.prepositions
