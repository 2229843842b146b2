"""The `oracle` backend: perfect perception read from GQA-format scene graphs.

With the oracle, a wrong answer is the program's fault, never the tools': it separates program
errors from perception errors. It looks the scene up by the image's dataset id (GQA `imageId`,
or the file stem). What each call reads from the graph is in docs/oracle.md.

Conventions: an object is "in" a region when at least half of its box lies inside it (a detector
run on a crop sees objects cut by the border); phrases match names, attributes and relations as
whole phrases (`oracle_scene`, `phrases`, `lexicon`); depth follows the ground-plane cue (an object
whose bottom edge is lower in the image is nearer), so the depth of a found object is the API
`lower` of the object itself; questions are read by `oracle_vqa`, which always answers.
"""

from __future__ import annotations

import statistics
from typing import Any

from vprl.data.boxes import box_to_top_left
from vprl.executor.tools.base import ToolBackend
from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.errors import ToolUnavailable
from vprl.executor.tools.images import ImageStore
from vprl.executor.tools.inflection import load as load_inflection
from vprl.executor.tools.inflection import same_noun
from vprl.executor.tools.lexicon import categories_of
from vprl.executor.tools.oracle_scene import SceneObject, View, scene_objects, strip_fillers, tokens
from vprl.executor.tools.oracle_vqa import answer
from vprl.executor.tools.phrases import attribute_phrases, norm_attr, words

__all__ = ["OracleBackend", "SceneObject", "one_hot_scores"]


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
            from vprl.data.loaders.gqa import load_scene_graphs

            # A world can span several files (the shapes world writes one per task).
            scenes = {}
            for path in [scene_graphs] if isinstance(scene_graphs, str) else scene_graphs:
                scenes.update(load_scene_graphs(path))
        self.scenes = scenes
        self.llm_answers = dict(llm_answers or {})
        self.min_visible = min_visible
        self._objects: dict[str, list[SceneObject]] = {}

    def preload(self) -> list[str]:
        load_inflection()
        return ["inflect (noun forms)"]

    # -- scene lookup ------------------------------------------------------------------------
    def _scene_objects(self, ref: str) -> list[SceneObject]:
        info = self.images.get(ref)
        key = info.image_id
        if key not in self._objects:
            if key not in self.scenes:
                raise ToolUnavailable(f"the oracle has no scene graph for image {key!r}")
            scene = self.scenes[key]
            if hasattr(scene, "to_json"):  # a `vprl.data.loaders.gqa.SceneGraph` record
                scene = scene.to_json()
            self._objects[key] = scene_objects(scene)
        return self._objects[key]

    def _region(self, call: ToolCall) -> tuple[float, float, float, float]:
        info = self.images.get(call.image)
        if call.box is None:
            return (0, 0, info.width, info.height)
        return box_to_top_left(call.box, info.height)

    def _view(self, call: ToolCall) -> View:
        return View(self._scene_objects(call.image), self._region(call), self.min_visible)

    def _visible(self, call: ToolCall) -> list[SceneObject]:
        return self._view(call).visible

    # -- tools -------------------------------------------------------------------------------
    def detect(self, calls: list[ToolCall]) -> list[Any]:
        out = []
        for call in calls:
            view = self._view(call)
            noun = tokens(call.args.get("noun", ""))
            # A phrase of no content words ("", "the") finds every object, as a generic "object" does.
            found = view.resolve(noun) if strip_fillers(noun) else list(view.visible)
            found.sort(key=lambda o: (o.x0, o.y0))
            out.append([{"box": [o.x0, o.y0, o.x1, o.y1], "score": 1.0, "label": o.name} for o in found])
        return out

    def verify(self, calls: list[ToolCall]) -> list[Any]:
        out = []
        for call in calls:
            view = self._view(call)
            objs = view.resolve(tokens(call.args.get("object_name", ""))) or view.visible
            prop = tokens(call.args.get("property", ""))
            out.append(any(view.has(o, prop) for o in objs))
        return out

    def vqa(self, calls: list[ToolCall]) -> list[Any]:
        out: list[Any] = []
        for call in calls:
            reply = answer(self._view(call), call.args.get("question", ""))
            choices = call.args.get("choices")
            out.append(reply if choices is None else {"answer": reply, "scores": one_hot_scores(reply, choices)})
        return out

    def caption(self, calls: list[ToolCall]) -> list[Any]:
        out = []
        for call in calls:
            objs = sorted(self._visible(call), key=lambda o: (o.x0, o.y0))
            parts = [" ".join([*sorted(o.attributes), o.name]) for o in objs]
            out.append("an image of " + (", ".join(f"a {p}" for p in parts) if parts else "nothing"))
        return out

    def itm(self, calls: list[ToolCall]) -> list[Any]:
        """The share of a text's content words that name what the region holds: the objects' names
        (in any inflection) and the categories covering them, and their attributes."""
        out = []
        for call in calls:
            names, known = set(), set()
            for o in self._visible(call):
                name = tuple(words(o.name))
                names |= {*name, *(w for cat in categories_of(name) for w in cat.split())}
                known |= {w for a in attribute_phrases(o.attributes) for w in a.split()}
            scores = []
            for text in call.args.get("texts", []):
                content = [norm_attr(w) for w in words(text) if w not in _STOP]
                hits = sum(w in known or any(same_noun(w, n) for n in names) for w in content)
                scores.append(hits / max(len(content), 1))
            out.append(scores)
        return out

    def depth(self, calls: list[ToolCall]) -> list[Any]:
        """The region's depth: for a patch of one object (what `find` returned), that object's own
        bottom edge; for any other region, the median bottom edge of the objects in it (its parts'
        edges would pull a person's depth up to their hair)."""
        out = []
        for call in calls:
            height = self.images.get(call.image).height
            view = self._view(call)
            own = view.own()
            if own is not None:
                out.append(float(height - own.y1))
            elif view.visible:
                out.append(float(statistics.median(height - o.y1 for o in view.visible)))
            else:
                out.append(float(height - view.region[3]))
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
