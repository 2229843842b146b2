"""Referring expressions in the shapes world: phrases that pick out exactly one object, each with
a gold program that returns that object's `ImagePatch`.

Three kinds: by attributes ("the large red circle"), by a relation to a unique anchor ("the
square to the left of the blue star") and by an extreme position ("the leftmost triangle").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vprl.data.shapes.references import ANY_REF, EXTREMES, MARGIN, RELATIONS, program, select, unique_ref
from vprl.data.shapes.scene import Scene, ShapeObject

ATTRIBUTE_REFS = (("color", "shape"), ("size", "color", "shape"))


@dataclass(frozen=True)
class Referral:
    object_id: str
    kind: str  # attribute | relation | position
    sentence: str
    program: str


def attribute_referral(obj: ShapeObject, scene: Scene) -> Referral | None:
    ref = unique_ref(obj, scene.objects, ATTRIBUTE_REFS)
    if ref is None:
        return None
    return Referral(obj.id, "attribute", f"the {ref}", program(f'return image_patch.find("{ref}")[0]'))


def relation_referral(obj: ShapeObject, scene: Scene, rng: np.random.Generator) -> Referral | None:
    for i in rng.permutation(len(scene.objects)):
        anchor = scene.objects[int(i)]
        aref = unique_ref(anchor, scene.objects, ANY_REF)
        if anchor is obj or aref is None:
            continue
        for rel in [list(RELATIONS)[int(k)] for k in rng.permutation(len(RELATIONS))]:
            truth, cond = RELATIONS[rel]
            same = [o for o in select(scene.objects, shape=obj.shape) if o is not anchor]
            sides = [truth(o, anchor, scene.height) for o in same]
            if all(abs(v) >= MARGIN for v in sides) and [o for o, v in zip(same, sides) if v > 0] == [obj]:
                lines = (
                    f'anchor = image_patch.find("{aref}")[0]',
                    f'return [p for p in image_patch.find("{obj.shape}") if {cond}][0]',
                )
                return Referral(obj.id, "relation", f"the {obj.shape} {rel} the {aref}", program(*lines))
    return None


def position_referral(obj: ShapeObject, scene: Scene, rng: np.random.Generator) -> Referral | None:
    group = select(scene.objects, shape=obj.shape)
    if len(group) < 2:
        return None
    for k in rng.permutation(len(EXTREMES)):
        word = list(EXTREMES)[int(k)]
        key, fn, expr = EXTREMES[word]
        ranked = sorted(group, key=lambda o: key(o, scene.height), reverse=True)
        if ranked[0] is obj and key(ranked[0], scene.height) - key(ranked[1], scene.height) >= MARGIN:
            line = f'return {fn}(image_patch.find("{obj.shape}"), key=lambda p: {expr})'
            return Referral(obj.id, "position", f"the {word} {obj.shape}", program(line))
    return None


def referrals(scene: Scene, rng: np.random.Generator, max_refs: int = 3) -> list[tuple[ShapeObject, list[Referral]]]:
    """Up to `max_refs` objects of the scene, each with every kind of referral that works for it."""
    out = []
    for i in rng.permutation(len(scene.objects)):
        obj = scene.objects[int(i)]
        found = [
            r
            for r in (
                attribute_referral(obj, scene),
                relation_referral(obj, scene, rng),
                position_referral(obj, scene, rng),
            )
            if r is not None
        ]
        if found:
            out.append((obj, found))
        if len(out) == max_refs:
            break
    return out
