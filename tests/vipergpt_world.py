"""Shared pieces of the tests that run programs written in the style of ViperGPT's prompt files.

`RuleLanguageModel` is the oracle backend with a rule-following stand-in for the language model: a
test double for `llm` only, so that programs which reach the language model (`llm_query`,
`process_guesses`, `select_answer`) run on a CPU with the same perfect perception as the rest. It
answers from a table of known facts (a prompt holding a key gets its value) and, for a choice among
options, picks the option the gathered information names, as a language model reading it would.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
from PIL import Image

from vprl.executor.api import SourceImage, Video
from vprl.executor.program import run_in_process
from vprl.executor.tools.errors import ToolUnavailable
from vprl.executor.tools.images import ImageStore
from vprl.executor.tools.local import LocalToolClient
from vprl.executor.tools.oracle import OracleBackend

NUMBER_WORDS = {"0": "zero", "1": "one", "2": "two", "3": "three", "4": "four", "5": "five"}


class RuleLanguageModel(OracleBackend):
    def __init__(self, images: ImageStore, scenes: dict, facts: dict[str, str] | None = None):
        super().__init__(images, scenes=scenes)
        self.facts = dict(facts or {})

    def llm(self, calls):
        return [self._reply(call.args.get("prompt", "")) for call in calls]

    def _reply(self, prompt: str) -> str:
        options = re.findall(r"^\d+\. (.+)$", prompt, flags=re.M)
        info = re.search(r"^Information: (.*)$", prompt, flags=re.M)
        if options and info:
            said = info.group(1).lower()
            digits = {NUMBER_WORDS.get(d, d) for d in re.findall(r"\b\d+\b", said)}
            for option in options:
                if re.search(rf"\b{re.escape(option.lower())}\b", said) or option.lower() in digits:
                    return option
            return options[0]
        for key, value in self.facts.items():
            if key in prompt:
                return value
        raise ToolUnavailable(f"the rule language model knows no answer to {prompt!r}")


def obj(name, x, y, w, h, attributes=(), relations=()):
    """One scene-graph object; `x, y` the top-left corner in pixels, as GQA writes it."""
    rels = [{"name": n, "object": o} for n, o in relations]
    return {"name": name, "x": x, "y": y, "w": w, "h": h, "attributes": list(attributes), "relations": rels}


def scene(width, height, **objects):
    return {"width": width, "height": height, "objects": objects}


def png(path: Path, scene_id: str, width: int, height: int) -> None:
    # The store keys images by content: each image gets a few pixels of its own.
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    digest = np.frombuffer(hashlib.sha1(scene_id.encode()).digest(), dtype=np.uint8)
    pixels[0, :6] = digest[:18].reshape(-1, 3)
    Image.fromarray(pixels).save(path)


def run(program: str, scenes: dict, tmp_path: Path, video: list[str] | None = None, facts=None, **inputs):
    """Run `program` in this process on the image `scenes` holds (or on the frames `video` names, in
    order), with the oracle and the rule language model. Returns the Outcome."""
    store = ImageStore()
    sources = {}
    for scene_id, graph in scenes.items():
        path = tmp_path / f"{scene_id.replace('#', '_')}.png"
        png(path, scene_id, graph["width"], graph["height"])
        info = store.add_file(path, image_id=scene_id)
        sources[scene_id] = SourceImage(info.ref, info.width, info.height)
    if video is not None:
        inputs["video"] = Video([sources[s] for s in video])
    else:
        (only,) = sources.values()
        inputs["image"] = only
    client = LocalToolClient(RuleLanguageModel(store, scenes, facts))
    outcome, _, _ = run_in_process(program, inputs, client)
    return outcome


def _box(graph: dict, object_id: str) -> list[int]:
    """The API box (left, lower, right, upper; origin bottom-left) of a scene object."""
    o = graph["objects"][object_id]
    return [o["x"], graph["height"] - o["y"] - o["h"], o["x"] + o["w"], graph["height"] - o["y"]]


def expected(graph: dict, answer):
    """The program answer a person's answer stands for: `{"object": id}` is that object's patch,
    `{"objects": [ids]}` the list of their patches, anything else itself."""
    if isinstance(answer, dict) and "object" in answer:
        return {"box": _box(graph, answer["object"])}
    if isinstance(answer, dict):
        return [{"box": _box(graph, o)} for o in answer["objects"]]
    return answer
