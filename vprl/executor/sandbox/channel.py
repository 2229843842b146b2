"""The program's side of its channel to the supervisor: fixed descriptors, the task's inputs as
JSON, and the `ToolClient` whose calls are request/reply frames.

Everything here runs inside a sandbox next to the program, which may have rebound any builtin for
its whole process (`import builtins; builtins.len = ...`): what we need is captured at import, and
the real builtins are put back before every frame we handle (the stdlib's JSON decoder looks
`len` & co. up in the builtins module).
"""

from __future__ import annotations

import base64
import builtins
from typing import Any

import numpy as np

from vprl.executor.api import SourceImage, Video
from vprl.executor.program import program_line
from vprl.executor.sandbox import framing
from vprl.executor.tools.errors import ToolError, ToolUnavailable

# Fixed descriptor numbers inside a sandbox.
STDOUT_FD = 1  # and 2: the capped output pipe
TO_SUPERVISOR_FD = 3  # frames the program side sends (rpc requests, the result)
FROM_SUPERVISOR_FD = 4  # rpc replies
MAX_PIXELS = 4096 * 4096 * 3  # bytes of one image a program may build and register

_isinstance = builtins.isinstance
_dict = builtins.dict
_BUILTINS = dict(builtins.__dict__)
_builtins_dict = builtins.__dict__


def restore_builtins() -> None:
    for name, value in _BUILTINS.items():
        if _builtins_dict.get(name) is not value:
            _builtins_dict[name] = value


def encode_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """Inputs as JSON: a `SourceImage` becomes a tagged handle (ref and size, never pixels), a
    `Video` a tagged list of them."""
    out = {}
    for name, value in inputs.items():
        if isinstance(value, SourceImage):
            out[name] = {"__source_image__": [value.ref, value.width, value.height]}
        elif isinstance(value, Video):
            out[name] = {"__video__": [[f.ref, f.width, f.height] for f in value.frames]}
        else:
            out[name] = value
    return out


def decode_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, value in inputs.items():
        if _isinstance(value, _dict) and "__source_image__" in value:
            ref, width, height = value["__source_image__"]
            out[name] = SourceImage(ref, width, height)
        elif _isinstance(value, _dict) and "__video__" in value:
            out[name] = Video([SourceImage(ref, width, height) for ref, width, height in value["__video__"]])
        else:
            out[name] = value
    return out


class ChannelClient:
    """The `ToolClient` of a sandboxed program: each call is one blocking request/reply frame pair."""

    def __init__(self, max_reply: int) -> None:
        self.max_reply = max_reply
        self._pixels: dict[str, np.ndarray] = {}

    def _rpc(self, request: dict[str, Any]) -> Any:
        restore_builtins()
        try:
            framing.send_blocking(TO_SUPERVISOR_FD, request)
            reply = framing.recv_blocking(FROM_SUPERVISOR_FD, self.max_reply)
        except (OSError, framing.FrameError) as exc:
            raise ToolUnavailable(f"the channel to the tool host is broken: {exc}") from None
        if "ok" in reply:
            return reply["ok"]
        if reply.get("error") == "ToolError":
            raise ToolError(reply.get("message", ""))
        raise ToolUnavailable(reply.get("message", "tool host failure"))

    def call(self, tool: str, image: str | None, box, args: dict[str, Any]) -> Any:
        # The program's line goes with the request: only this side can see the program's frames.
        return self._rpc(
            {
                "op": "rpc",
                "method": "call",
                "tool": tool,
                "image": image,
                "box": list(box) if box else None,
                "args": args,
                "line": program_line(),
            }
        )

    def pixels(self, image: str) -> np.ndarray:
        if image not in self._pixels:
            reply = self._rpc({"op": "rpc", "method": "pixels", "image": image})
            height, width = reply["shape"]
            data = base64.b64decode(reply["data"])
            self._pixels[image] = np.frombuffer(data, dtype=np.uint8).reshape(height, width, 3)
        return self._pixels[image]

    def register_pixels(self, pixels) -> tuple[str, int, int]:
        arr = np.ascontiguousarray(pixels, dtype=np.uint8)
        if arr.ndim != 3 or arr.shape[2] != 3 or arr.nbytes > MAX_PIXELS:
            raise ValueError(f"an image must be (H, W, 3) and at most {MAX_PIXELS} bytes, got shape {arr.shape}")
        reply = self._rpc(
            {
                "op": "rpc",
                "method": "register",
                "shape": [int(arr.shape[0]), int(arr.shape[1])],
                "data": base64.b64encode(arr.tobytes()).decode("ascii"),
            }
        )
        ref, width, height = reply
        return str(ref), int(width), int(height)
