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
from pathlib import Path
from typing import Any, ClassVar

TOOLS: tuple[str, ...] = ("detect", "verify", "vqa", "caption", "itm", "depth", "llm")
MAX_TEXT = 2000  # longest string argument a tool accepts
MAX_TEXTS = 64  # most texts in one `itm` call


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
    """Maps content hashes to `ImageInfo`; shared by the API side and the backends."""

    def __init__(self) -> None:
        self._by_ref: dict[str, ImageInfo] = {}

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
        return self._by_ref[ref]

    def add_array(self, pixels, image_id: str | None = None) -> ImageInfo:
        ref = array_ref(pixels)
        if ref not in self._by_ref:
            height, width = pixels.shape[:2]
            self._by_ref[ref] = ImageInfo(ref, width, height, None, image_id, pixels)
        return self._by_ref[ref]

    def add(self, info: ImageInfo) -> ImageInfo:
        return self._by_ref.setdefault(info.ref, info)

    def get(self, ref: str) -> ImageInfo:
        try:
            return self._by_ref[ref]
        except KeyError:
            raise ToolUnavailable(f"unknown image {ref}: it was never registered with the tool host") from None

    def __contains__(self, ref: str) -> bool:
        return ref in self._by_ref


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
    return call


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
