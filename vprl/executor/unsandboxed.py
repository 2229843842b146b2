"""The batch runner's `sandbox: none` path: programs run INSIDE this process, for debugging trusted programs.

No isolation and no time limit. A program runs on a worker thread of the runner's event loop, one
at a time (the API's bound tool client is process-global), and its tool requests go back to the
runner's loop through `BridgeClient`, which hands them to the same `answer` coroutine that serves a
sandbox's requests: one trace, one tool-call cap, one notion of which failures are ours. The time
spent waiting on those answers is measured here (the sandbox supervisor measures it otherwise).
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

from vprl.executor.host import ToolHost
from vprl.executor.program import program_line, run_in_process
from vprl.executor.tools.errors import ToolError, ToolUnavailable

Answer = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]  # one request -> a reply frame; never raises


def warn_unsandboxed(stacklevel: int = 3) -> None:
    """The loud warning `sandbox: none` owes its user (by default pointing at the caller's caller)."""
    warnings.warn(
        "sandbox: none — programs run INSIDE this process with NO isolation and NO time limit; "
        "use it only to debug trusted programs",
        RuntimeWarning,
        stacklevel=stacklevel,
    )


class BridgeClient:
    """`ToolClient` for `sandbox: none`: the program's thread asks the runner's loop."""

    def __init__(self, host: ToolHost, owner: object, answer: Answer, loop: asyncio.AbstractEventLoop) -> None:
        self.host, self.owner, self.answer, self.loop = host, owner, answer, loop
        self.rpc_wait = 0.0  # seconds the program spent waiting on the tool host

    def _ask(self, request: dict[str, Any]) -> Any:
        t0 = time.perf_counter()
        reply = asyncio.run_coroutine_threadsafe(self.answer(request), self.loop).result()
        self.rpc_wait += time.perf_counter() - t0
        if "ok" in reply:
            return reply["ok"]
        if reply["error"] == "ToolError":
            raise ToolError(reply["message"])
        raise ToolUnavailable(reply["message"])

    def call(self, tool, image, box, args):
        box = list(box) if box else None
        return self._ask(
            {"method": "call", "tool": tool, "image": image, "box": box, "args": args, "line": program_line()}
        )

    def pixels(self, image):
        return self.host.images.get(image).load_pixels()

    def register_pixels(self, pixels):
        info = self.host.register_array(pixels, owner=self.owner)
        return info.ref, info.width, info.height


async def run_unsandboxed(
    host: ToolHost, owner: object, answer: Answer, lock: asyncio.Lock, source: str, inputs: dict[str, Any]
) -> dict[str, Any]:
    """Run one program here; returns its result frame (the fields the sandbox supervisor's `done` has).

    `owner` holds the images the program registers; `lock` serialises programs (see the module doc).
    """
    loop = asyncio.get_running_loop()
    client = BridgeClient(host, owner, answer, loop)
    async with lock:
        outcome, stdout, seconds = await loop.run_in_executor(None, run_in_process, source, inputs, client)
    return {
        "status": outcome.status,
        "answer": outcome.answer,
        "error": outcome.error,
        "stdout": stdout,
        "duration_s": seconds,
        "rpc_wait_s": client.rpc_wait,
    }


__all__ = ["BridgeClient", "run_unsandboxed", "warn_unsandboxed"]
