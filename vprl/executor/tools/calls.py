"""Tool calls: what a program asks a tool, the tools and their arguments, and checking a call.

Every perception call a program makes becomes a `ToolCall`: the tool's name, the content hash of
the image, the region in the API's convention and the arguments; `validate_call` checks one
before it reaches a backend. All of it is plain JSON so it can travel from a sandbox to the tool
host.

Tools and what they return (JSON):

=========  ==================================  ==============================================
tool       args                                result
=========  ==================================  ==============================================
detect     noun: str, threshold: float|None    list of {"box": [x0, y0, x1, y1], "score", "label"}
                                               boxes in *top-left* pixels of the whole image
verify     object_name: str, property: str     bool: does the object in the region have it
vqa        question: str                       str: a short answer about the region
           question: str, choices: list[str]   {"answer": str, "scores": {choice: probability}}
                                               (over the given choices, summing to 1)
caption    -                                   str: a short description of the region
itm        texts: list[str]                    list[float]: a match score per text (higher =
                                               better; comparable across regions)
depth      -                                   float: median depth of the region, larger = farther
llm        prompt: str                         str: a text answer (no image; image/box are None)
=========  ==================================  ==============================================
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from vprl.data.boxes import Box, check_box
from vprl.executor.limits import MAX_MESSAGE
from vprl.executor.tools.errors import ToolError
from vprl.executor.tools.images import ImageStore

TOOLS: tuple[str, ...] = ("detect", "verify", "vqa", "caption", "itm", "depth", "llm")
MAX_TEXT = 2000  # longest string argument a tool accepts
MAX_TEXTS = 64  # most texts in one `itm` call
MAX_CHOICES = 8  # most answer choices in one `vqa` call (each is scored by the VQA model)
MAX_CHOICE_TEXT = 64  # longest answer choice


@dataclass(frozen=True)
class ToolCall:
    """One call of one tool on one region of one image."""

    tool: str
    image: str | None  # content hash of the image (see `ImageStore`), None for `llm`
    box: Box | None
    args: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "image": self.image, "box": list(self.box) if self.box else None, "args": self.args}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> ToolCall:
        box = row.get("box")
        return cls(
            row["tool"], row.get("image"), tuple(int(v) for v in box) if box else None, dict(row.get("args") or {})
        )

    def cache_key(self, backend_hash: str) -> str:
        """Content key: same tool, backend config, image, region and arguments => same answer."""
        blob = json.dumps([backend_hash, self.tool, self.image, self.box, self.args], sort_keys=True)
        return hashlib.sha1(blob.encode()).hexdigest()


def validate_call(call: ToolCall, images: ImageStore) -> ToolCall:
    """Check a call's arguments before it reaches a backend; raise `ToolError` with a short reason."""
    if call.tool not in TOOLS:
        raise ToolError(f"unknown tool {call.tool!r}; tools are {list(TOOLS)}")
    if call.tool != "llm":
        if call.image is None:
            raise ToolError(f"{call.tool} needs an image")
        info = images.get(call.image)
        if call.box is not None:
            try:
                check_box(call.box, info.width, info.height)
            except ValueError as exc:
                raise ToolError(str(exc)) from None
    for key, value in call.args.items():
        _check_arg(call.tool, key, value)
    if call.tool == "vqa" and "choices" in call.args:
        _check_choices(call.args["choices"])
    return call


def _check_choices(choices: Any) -> None:
    """`vqa(choices=[...])`: 1..MAX_CHOICES distinct, non-blank, short strings (the result is keyed by them)."""
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise ToolError(f"vqa: `choices` must be a non-empty list of strings, got {choices!r}"[:MAX_MESSAGE])
    if len(choices) > MAX_CHOICES:
        raise ToolError(f"vqa: `choices` has {len(choices)} items (at most {MAX_CHOICES})")
    for choice in choices:
        if not choice.strip() or len(choice) > MAX_CHOICE_TEXT:
            raise ToolError(
                f"vqa: each choice must be 1 to {MAX_CHOICE_TEXT} characters and not blank, got {choice!r}"[
                    :MAX_MESSAGE
                ]
            )
    if len(set(choices)) != len(choices):
        raise ToolError(f"vqa: `choices` must be distinct, got {choices!r}"[:MAX_MESSAGE])


def _check_arg(tool: str, key: str, value: Any) -> None:
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise ToolError(f"{tool}: argument {key!r} is {len(value)} characters long (at most {MAX_TEXT})")
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ToolError(f"{tool}: argument {key!r} must be a finite number, got {value!r}")
    elif isinstance(value, list):
        if len(value) > MAX_TEXTS:
            raise ToolError(f"{tool}: argument {key!r} has {len(value)} items (at most {MAX_TEXTS})")
        for item in value:
            if not isinstance(item, str):
                raise ToolError(f"{tool}: argument {key!r} must be a list of strings")
            _check_arg(tool, key, item)
    else:
        raise ToolError(f"{tool}: argument {key!r} has unsupported type {type(value).__name__}")
