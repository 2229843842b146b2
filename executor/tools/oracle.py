"""The `oracle` backend: perfect perception read from GQA-format scene graphs.

With the oracle, a wrong answer is the program's fault, never the tools': it separates program
errors from perception errors. It looks the scene up by the image's dataset id (GQA `imageId`,
or the file stem).

Conventions: an object is "in" a region when at least half of its box lies inside it (a detector
run on a crop sees objects cut by the border); depth follows the ground-plane cue (an object whose
bottom edge is lower in the image is nearer), so depth is the API `lower` of the object.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from data.boxes import box_to_top_left, intersection_area
from executor.tools.base import ToolBackend
from executor.tools.calls import ToolCall
from executor.tools.errors import ToolError, ToolUnavailable
from executor.tools.images import ImageStore
from executor.tools.phrases import norm_attr, parse_noun_phrase, parse_question, words
from executor.tools.vocabulary import COLOR_WORDS, MATERIAL_WORDS, SIZE_WORDS


@dataclass(frozen=True)
class SceneObject:
    id: str
    name: str
    x0: float
    y0: float
    x1: float
    y1: float  # top-left pixel box
    attributes: frozenset[str]

    @property
    def area(self) -> float:
        return (self.x1 - self.x0) * (self.y1 - self.y0)

    def overlap(self, x0: float, y0: float, x1: float, y1: float) -> float:
        return intersection_area((self.x0, self.y0, self.x1, self.y1), (x0, y0, x1, y1))


class OracleBackend(ToolBackend):
    name = "oracle"

    def __init__(
        self,
        images: ImageStore,
        scenes: dict[str, dict] | None = None,
        scene_graphs: str | list[str] | None = None,
        llm_answers: dict[str, str] | None = None,
        min_visible: float = 0.5,
    ):
        if scenes is None and scene_graphs is None:
            raise ValueError("the oracle backend needs `scene_graphs` (a GQA sceneGraphs JSON file) or `scenes`")
        super().__init__(
            images, scene_graphs=scene_graphs, min_visible=min_visible, llm_answers=sorted((llm_answers or {}).items())
        )
        if scenes is None:
            from data.loaders.gqa import load_scene_graphs

            # A world can span several files (the shapes world writes one per task).
            scenes = {}
            for path in [scene_graphs] if isinstance(scene_graphs, str) else scene_graphs:
                scenes.update(load_scene_graphs(path))
        self.scenes = scenes
        self.llm_answers = dict(llm_answers or {})
        self.min_visible = min_visible
        self._objects: dict[str, list[SceneObject]] = {}

    # -- scene lookup ------------------------------------------------------------------------
    def _scene_objects(self, ref: str) -> list[SceneObject]:
        info = self.images.get(ref)
        key = info.image_id
        if key not in self._objects:
            if key not in self.scenes:
                raise ToolUnavailable(f"the oracle has no scene graph for image {key!r}")
            scene = self.scenes[key]
            if hasattr(scene, "to_json"):  # a `data.loaders.gqa.SceneGraph` record
                scene = scene.to_json()
            self._objects[key] = [
                SceneObject(
                    str(oid),
                    str(o["name"]).lower(),
                    o["x"],
                    o["y"],
                    o["x"] + o["w"],
                    o["y"] + o["h"],
                    frozenset(norm_attr(a) for a in o.get("attributes", ())),
                )
                for oid, o in scene["objects"].items()
            ]
        return self._objects[key]

    def _region(self, call: ToolCall) -> tuple[float, float, float, float]:
        info = self.images.get(call.image)
        if call.box is None:
            return (0, 0, info.width, info.height)
        return box_to_top_left(call.box, info.height)

    def _visible(self, call: ToolCall) -> list[SceneObject]:
        region = self._region(call)
        objs = self._scene_objects(call.image)
        return [o for o in objs if o.area > 0 and o.overlap(*region) >= self.min_visible * o.area]

    def _matching(self, call: ToolCall, phrase: str) -> list[SceneObject]:
        np_ = parse_noun_phrase(phrase)
        return [o for o in self._visible(call) if np_.matches(o.name, o.attributes)]

    def _main_object(self, call: ToolCall, phrase: str = "") -> SceneObject | None:
        """The object a question about the region is about: the named one, else the most visible."""
        region = self._region(call)
        candidates = self._matching(call, phrase) if phrase else []
        candidates = candidates or self._visible(call)
        return max(candidates, key=lambda o: o.overlap(*region), default=None)

    # -- tools -------------------------------------------------------------------------------
    def detect(self, calls: list[ToolCall]) -> list[Any]:
        out = []
        for call in calls:
            found = sorted(self._matching(call, call.args.get("noun", "")), key=lambda o: (o.x0, o.y0))
            out.append([{"box": [o.x0, o.y0, o.x1, o.y1], "score": 1.0, "label": o.name} for o in found])
        return out

    def verify(self, calls: list[ToolCall]) -> list[Any]:
        out = []
        for call in calls:
            objs = self._matching(call, call.args.get("object_name", "")) or self._visible(call)
            wanted = {norm_attr(w) for w in words(call.args.get("property", ""))} - {"made", "of", "a", "an", "the"}
            out.append(bool(wanted) and any(wanted <= (o.attributes | {o.name}) for o in objs))
        return out

    def vqa(self, calls: list[ToolCall]) -> list[Any]:
        out: list[Any] = []
        for call in calls:
            answer = self._answer(call, call.args.get("question", ""))
            choices = call.args.get("choices")
            out.append(answer if choices is None else {"answer": answer, "scores": one_hot_scores(answer, choices)})
        return out

    def _answer(self, call: ToolCall, question: str) -> str:
        q = parse_question(question)
        if q.kind == "count":
            return str(len(self._matching(call, q.target)))
        if q.kind == "exists":
            return "yes" if self._matching(call, q.target) else "no"
        obj = self._main_object(call, q.target)
        if obj is None:
            return "nothing"
        if q.kind == "what":
            return obj.name
        if q.kind == "shape":
            return obj.name
        vocab = {"color": COLOR_WORDS, "size": SIZE_WORDS, "material": MATERIAL_WORDS}.get(q.kind)
        if vocab is not None:
            return next((a for a in sorted(obj.attributes) if a in {norm_attr(v) for v in vocab}), "unknown")
        if q.kind == "verify":
            return "yes" if norm_attr(q.value) in obj.attributes | {obj.name} else "no"
        if q.kind == "action":
            # GQA writes activities as gerund attributes ("standing", "looking").
            return " and ".join(sorted(a for a in obj.attributes if len(a) > 4 and a.endswith("ing"))) or "nothing"
        raise ToolError(
            f"the oracle cannot answer {question!r}: ask about existence, counts, colour, shape, "
            "size, material, what someone is doing or 'what is this'"
        )

    def caption(self, calls: list[ToolCall]) -> list[Any]:
        out = []
        for call in calls:
            objs = sorted(self._visible(call), key=lambda o: (o.x0, o.y0))
            parts = [" ".join([*sorted(o.attributes), o.name]) for o in objs]
            out.append("an image of " + (", ".join(f"a {p}" for p in parts) if parts else "nothing"))
        return out

    def itm(self, calls: list[ToolCall]) -> list[Any]:
        out = []
        for call in calls:
            known = set()
            for o in self._visible(call):
                known |= set(o.attributes) | {o.name, *words(o.name)}
            scores = []
            for text in call.args.get("texts", []):
                content = [norm_attr(w) for w in words(text) if w not in _STOP]
                scores.append(sum(w in known or w.rstrip("s") in known for w in content) / max(len(content), 1))
            out.append(scores)
        return out

    def depth(self, calls: list[ToolCall]) -> list[Any]:
        out = []
        for call in calls:
            height = self.images.get(call.image).height
            objs = self._visible(call)
            if objs:
                out.append(float(statistics.median(height - o.y1 for o in objs)))
            else:
                out.append(float(height - self._region(call)[3]))
        return out

    def llm(self, calls: list[ToolCall]) -> list[Any]:
        out = []
        for call in calls:
            prompt = call.args.get("prompt", "")
            if prompt not in self.llm_answers:
                raise ToolUnavailable(
                    "the oracle backend has no language model; give it `llm_answers` or use a "
                    "tool stack with an llm tool"
                )
            out.append(self.llm_answers[prompt])
        return out


_STOP = frozenset(
    {
        "a",
        "an",
        "the",
        "of",
        "in",
        "on",
        "at",
        "to",
        "is",
        "are",
        "there",
        "with",
        "and",
        "photo",
        "image",
        "picture",
        "this",
        "that",
    }
)


def _fold(text: str) -> str:
    return " ".join(text.lower().split()).strip(" .,!?")


def one_hot_scores(answer: str, choices: list[str]) -> dict[str, float]:
    """Probabilities over `choices` from a deterministic answer: all mass on the choice(s) equal to
    it (case, spacing and end punctuation folded); uniform when it is none of them (no preference)."""
    hits = [c for c in choices if _fold(c) == _fold(answer)]
    support = hits or choices
    return {c: (1.0 / len(support) if c in support else 0.0) for c in choices}
