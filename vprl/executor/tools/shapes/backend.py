"""The `shapes` backend: tools for the shapes world that look only at pixels.

It finds objects with classical vision (`segmentation.py`) and then answers every tool exactly as
the `oracle` backend answers from a scene graph (same region rule, same question parsing, same
depth cue: lower in the image is nearer). So with the same programs, the gap between the two
backends is the perception error alone. It never reads annotations: the image's pixels are all
it gets. Segmentations are cached per image ref, so a tool call costs a lookup and a filter.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

from vprl.executor.tools.base import ToolBackend
from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.images import ImageStore
from vprl.executor.tools.oracle import OracleBackend, SceneObject
from vprl.executor.tools.phrases import norm_attr, parse_noun_phrase, singular, words
from vprl.executor.tools.shapes.segmentation import segment

# Words that join the noun phrases of a caption; the relations are checked on the boxes.
_SPLIT = re.compile(r"\b(?:and|to the left of|to the right of|left of|right of|above|below|near|next to|with)\b")
_RELATION_TESTS = {
    "to the left of": lambda a, b: (a.x0 + a.x1) < (b.x0 + b.x1),
    "left of": lambda a, b: (a.x0 + a.x1) < (b.x0 + b.x1),
    "to the right of": lambda a, b: (a.x0 + a.x1) > (b.x0 + b.x1),
    "right of": lambda a, b: (a.x0 + a.x1) > (b.x0 + b.x1),
    "above": lambda a, b: (a.y0 + a.y1) < (b.y0 + b.y1),  # top-left boxes: smaller y is higher
    "below": lambda a, b: (a.y0 + a.y1) > (b.y0 + b.y1),
}
_FILLER = ("image of", "photo of", "picture of", "there is", "there are")


class ShapesBackend(OracleBackend):
    name = "shapes"
    llm = None  # no language model: `supports("llm")` is False and the host says so

    def __init__(self, images: ImageStore, min_visible: float = 0.5, cache_size: int = 4096):
        ToolBackend.__init__(self, images, min_visible=min_visible)
        self.min_visible = min_visible
        self.llm_answers: dict[str, str] = {}
        self.cache_size = cache_size
        self._found: OrderedDict[str, list[SceneObject]] = OrderedDict()

    def _scene_objects(self, ref: str) -> list[SceneObject]:
        """The objects segmented from the image's pixels (cached, least recently used dropped)."""
        if ref in self._found:
            self._found.move_to_end(ref)
            return self._found[ref]
        blobs = segment(self.images.get(ref).load_pixels())
        objs = [
            SceneObject(str(i), b.shape, b.x0, b.y0, b.x1, b.y1, frozenset((b.color, b.size)))
            for i, b in enumerate(blobs)
        ]
        self._found[ref] = objs
        if len(self._found) > self.cache_size:
            self._found.popitem(last=False)
        return objs

    def itm(self, calls: list[ToolCall]) -> list[Any]:
        """Score each text by how many of its noun phrases name a found object (partial credit
        for known words), plus whether a spatial relation between two of them holds."""
        return [[self._text_score(text, self._visible(call)) for text in call.args.get("texts", [])] for call in calls]

    def _text_score(self, text: str, objs: list[SceneObject]) -> float:
        text = " ".join(words(text))
        for filler in _FILLER:
            text = text.replace(filler, " ")
        relation = next((r for r in _RELATION_TESTS if f" {r} " in f" {text} "), None)
        phrases = [p.strip() for p in _SPLIT.split(text) if p.strip()]
        known = set()
        for o in objs:
            known |= set(o.attributes) | {o.name}
        scores, matches = [], []
        for phrase in phrases:
            np_ = parse_noun_phrase(phrase)
            found = [o for o in objs if np_.matches(o.name, o.attributes)] if (np_.head or np_.modifiers) else []
            matches.append(found)
            if found:
                scores.append(1.0)
            else:
                content = [norm_attr(singular(w)) for w in words(phrase) if w not in ("a", "an", "the", "object")]
                scores.append(0.5 * sum(w in known for w in content) / max(len(content), 1))
        if not scores:
            return 0.0
        score = sum(scores) / len(scores)
        if relation and len(matches) == 2 and all(matches):
            test = _RELATION_TESTS[relation]
            score += 0.5 if any(test(a, b) for a in matches[0] for b in matches[1] if a is not b) else -0.5
        return score
