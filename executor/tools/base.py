"""The tool backend protocol: batched calls on (image, box) pairs.

Every perception call a program makes becomes a `ToolCall`: the tool's name, the content hash of
the image, the region in the API's convention and the arguments. Backends answer lists of calls
at once (so GPU backends can batch). All of it is plain JSON so it can travel from a sandbox to
the tool host.

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
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

TOOLS: tuple[str, ...] = ("detect", "verify", "vqa", "caption", "itm", "depth", "llm")
MAX_TEXT = 2000  # longest string argument a tool accepts
MAX_TEXTS = 64  # most texts in one `itm` call
MAX_CHOICES = 8  # most answer choices in one `vqa` call (each is scored by the VQA model)
MAX_CHOICE_TEXT = 64  # longest answer choice


class ToolError(Exception):
    """A tool refused a call because of what the program asked (bad arguments): a program error."""


class ToolUnavailable(Exception):
    """A tool could not answer for reasons of ours (backend down, not configured): infra error."""


Box = tuple[int, int, int, int]  # (left, lower, right, upper), API convention: origin bottom-left


def box_from_top_left(x0: float, y0: float, x1: float, y1: float, height: int) -> Box:
    """Convert a detector's top-left `(x0, y0, x1, y1)` box to the API's `(left, lower, right, upper)`."""
    return (int(round(x0)), int(round(height - y1)), int(round(x1)), int(round(height - y0)))


def box_to_top_left(box: Box, height: int) -> tuple[int, int, int, int]:
    """Inverse of `box_from_top_left`: `(left, lower, right, upper)` to top-left `(x0, y0, x1, y1)`."""
    left, lower, right, upper = box
    return (left, height - upper, right, height - lower)


def check_box(box: Box, width: int, height: int) -> Box:
    """Return `box` as ints if it is a non-empty region inside a `width`x`height` image, else raise."""
    try:
        left, lower, right, upper = (int(v) for v in box)
    except (TypeError, ValueError):
        raise ValueError(f"box {box!r} must be four integers (left, lower, right, upper)") from None
    if not (0 <= left < right <= width and 0 <= lower < upper <= height):
        raise ValueError(
            f"box (left={left}, lower={lower}, right={right}, upper={upper}) is outside the "
            f"{width}x{height} image (need 0 <= left < right <= {width}, 0 <= lower < upper <= {height})"
        )
    return (left, lower, right, upper)


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


@dataclass
class ImageInfo:
    """What a backend may know about an image: where its pixels are and which scene it shows."""

    ref: str
    width: int
    height: int
    path: str | None = None
    image_id: str | None = None  # the dataset's id (GQA imageId, COCO id), for annotation lookups
    pixels: Any = None  # numpy (H, W, 3) uint8, loaded lazily

    def load_pixels(self):
        if self.pixels is None:
            if self.path is None:
                raise ToolUnavailable(f"image {self.ref} has neither pixels nor a path")
            self.pixels = load_rgb(self.path)
        return self.pixels


def load_rgb(path: str | Path):
    """Read an image file as a (H, W, 3) uint8 numpy array."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def file_ref(path: str | Path) -> str:
    """Content hash of an image file: the cache key part that names the image."""
    return hashlib.sha1(Path(path).read_bytes()).hexdigest()[:20]


def array_ref(pixels) -> str:
    """Content hash of a pixel array (for images that programs build themselves)."""
    h = hashlib.sha1(str(pixels.shape).encode())
    h.update(pixels.tobytes())
    return h.hexdigest()[:20]


class ImageStore:
    """Maps content hashes to `ImageInfo`; shared by the API side and the backends.

    Dataset images (`add_file`, `add_array` without an owner, `add`) stay for the store's life.
    Images a *program* builds are registered with an owner (`add_array(pixels, owner=task)`) and
    live only while an owner holds them: `release(owner)` (the runner calls it when the program's
    result is in) drops the owner's claims and evicts every image no one holds any more, unless a
    tool call on it is still queued or running (`pin`/`unpin`; it goes when the call is done). As
    a backstop against callers that never release, at most `max_program_images` program images and
    `max_program_bytes` of their pixels are kept; past that the least recently used one goes.
    """

    def __init__(self, max_program_images: int = 4096, max_program_bytes: int = 2 << 30) -> None:
        self._by_ref: dict[str, ImageInfo] = {}
        self.max_program_images = max_program_images
        self.max_program_bytes = max_program_bytes
        self._program_bytes = 0
        self._holders: OrderedDict[str, set[Hashable]] = OrderedDict()  # program images, least recently used first
        self._held: dict[Hashable, set[str]] = {}  # owner -> refs
        self._pins: dict[str, int] = {}

    def add_file(self, path: str | Path, image_id: str | None = None) -> ImageInfo:
        from PIL import Image

        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"image file {path} does not exist")
        ref = file_ref(path)
        if ref not in self._by_ref:
            with Image.open(path) as im:
                width, height = im.size
            self._by_ref[ref] = ImageInfo(ref, width, height, str(path), image_id or path.stem)
        self._keep(ref)
        return self._by_ref[ref]

    def add_array(self, pixels, image_id: str | None = None, owner: Hashable | None = None) -> ImageInfo:
        ref = array_ref(pixels)
        known = ref in self._by_ref
        if not known:
            height, width = pixels.shape[:2]
            self._by_ref[ref] = ImageInfo(ref, width, height, None, image_id, pixels)
        if owner is None:
            self._keep(ref)
        elif not known or ref in self._holders:  # a dataset image stays a dataset image
            if ref not in self._holders:
                self._holders[ref] = set()
                self._program_bytes += _nbytes(self._by_ref[ref])
            self._holders[ref].add(owner)
            self._holders.move_to_end(ref)
            self._held.setdefault(owner, set()).add(ref)
            while len(self._holders) > 1 and (
                len(self._holders) > self.max_program_images or self._program_bytes > self.max_program_bytes
            ):
                self._evict(next(iter(self._holders)))
        return self._by_ref[ref]

    def add(self, info: ImageInfo) -> ImageInfo:
        info = self._by_ref.setdefault(info.ref, info)
        self._keep(info.ref)
        return info

    def get(self, ref: str) -> ImageInfo:
        try:
            info = self._by_ref[ref]
        except KeyError:
            raise ToolUnavailable(f"unknown image {ref}: it was never registered with the tool host") from None
        if ref in self._holders:
            self._holders.move_to_end(ref)
        return info

    def __contains__(self, ref: str) -> bool:
        return ref in self._by_ref

    def __len__(self) -> int:
        return len(self._by_ref)

    # -- images programs build -------------------------------------------------------------------
    def program_built(self, ref: str) -> bool:
        """Whether `ref` is an image only programs registered (not a dataset image)."""
        return ref in self._holders

    def owned_bytes(self, owner: Hashable) -> int:
        """Pixel bytes of the program images `owner` holds."""
        return sum(_nbytes(self._by_ref[ref]) for ref in self._held.get(owner, ()) if ref in self._by_ref)

    def release(self, owner: Hashable) -> list[str]:
        """Drop `owner`'s claims; returns the refs evicted now (pinned ones go at their `unpin`)."""
        evicted = []
        for ref in self._held.pop(owner, ()):
            holders = self._holders.get(ref)
            if holders is None:
                continue
            holders.discard(owner)
            if not holders and not self._pins.get(ref):
                self._evict(ref)
                evicted.append(ref)
        return evicted

    def pin(self, ref: str) -> None:
        """Keep `ref` while a tool call on it is queued or running."""
        self._pins[ref] = self._pins.get(ref, 0) + 1

    def unpin(self, ref: str) -> None:
        left = self._pins.get(ref, 0) - 1
        if left > 0:
            self._pins[ref] = left
            return
        self._pins.pop(ref, None)
        if ref in self._holders and not self._holders[ref]:
            self._evict(ref)

    def _keep(self, ref: str) -> None:
        """`ref` is (also) a dataset image: never evict it."""
        self._untrack(ref)

    def _evict(self, ref: str) -> None:
        self._untrack(ref)
        self._by_ref.pop(ref, None)

    def _untrack(self, ref: str) -> None:
        if ref not in self._holders:
            return
        for owner in self._holders.pop(ref):
            self._held.get(owner, set()).discard(ref)
        self._program_bytes -= _nbytes(self._by_ref[ref])


def _nbytes(info: ImageInfo) -> int:
    return int(getattr(info.pixels, "nbytes", 0) or info.width * info.height * 3)


class ToolBackend:
    """Base class of tool backends. Subclasses implement the tools they support as batched methods
    `detect(calls) -> list`, `vqa(calls) -> list`, ... each returning one JSON result per call.
    """

    name: ClassVar[str] = ""

    def __init__(self, images: ImageStore, **config: Any) -> None:
        self.images = images
        self.config = config

    def config_hash(self) -> str:
        """Identifies the backend and its settings in cache keys; any change invalidates the cache."""
        blob = json.dumps([self.name, self.config], sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]

    def supports(self, tool: str) -> bool:
        return callable(getattr(self, tool, None)) and tool in TOOLS

    def run(self, tool: str, calls: list[ToolCall]) -> list[Any]:
        if not self.supports(tool):
            raise ToolUnavailable(f"the {self.name!r} backend has no {tool!r} tool")
        results = getattr(self, tool)(calls)
        if len(results) != len(calls):
            raise ToolUnavailable(f"{self.name}.{tool} returned {len(results)} results for {len(calls)} calls")
        return results


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
        raise ToolError(f"vqa: `choices` must be a non-empty list of strings, got {choices!r}"[:300])
    if len(choices) > MAX_CHOICES:
        raise ToolError(f"vqa: `choices` has {len(choices)} items (at most {MAX_CHOICES})")
    for choice in choices:
        if not choice.strip() or len(choice) > MAX_CHOICE_TEXT:
            raise ToolError(
                f"vqa: each choice must be 1 to {MAX_CHOICE_TEXT} characters and not blank, got {choice!r}"[:300]
            )
    if len(set(choices)) != len(choices):
        raise ToolError(f"vqa: `choices` must be distinct, got {choices!r}"[:300])


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


def short_result(result: Any, limit: int = 200) -> str:
    """A trace-sized rendering of a tool result."""
    text = json.dumps(result, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."
