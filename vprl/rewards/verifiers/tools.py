"""Calling tools from a (synchronous) reward through the executor's tool host.

The verifier's calls go through the same `ToolHost` as the programs' calls, so they share its
content-keyed cache, in-flight merging and micro-batching: verifying an answer a program already
asked about costs a cache lookup. The host's futures and timers belong to one event loop, so we
submit to the loop that already serves the host: the `SyncRunner`'s. A bare `ToolHost` (benchmarks,
scripts with no runner) gets a private loop thread; it must then not be shared with a running
`BatchRunner` at the same time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from vprl.data.records import Example
from vprl.executor.host import ToolHost
from vprl.executor.limits import MAX_MESSAGE
from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.errors import ToolError, ToolUnavailable
from vprl.executor.tools.images import ImageInfo


class ToolCaller:
    def __init__(self, host: ToolHost, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.host = host
        self._own_thread: threading.Thread | None = None
        if loop is None:
            loop = asyncio.new_event_loop()
            self._own_thread = threading.Thread(target=loop.run_forever, name="verifier-tools", daemon=True)
            self._own_thread.start()
        self.loop = loop

    @classmethod
    def from_resources(cls, runner: Any = None, tool_host: ToolHost | None = None) -> ToolCaller:
        """Prefer the runner (its loop already serves the host); else a bare tool host."""
        if runner is not None:
            # `SyncRunner` keeps its BatchRunner (with the host) and the loop it runs on.
            inner = getattr(runner, "runner", None)
            host, loop = getattr(inner, "host", None), getattr(runner, "_loop", None)
            if not isinstance(host, ToolHost) or loop is None:
                raise ValueError(f"the verifier reward needs an executor SyncRunner, got {type(runner).__name__}")
            if tool_host is not None and tool_host is not host:
                raise ValueError("the verifier reward got a runner and a different tool_host: they must be one host")
            return cls(host, loop)
        if tool_host is None:
            raise ValueError(
                "the verifier reward calls tools: pass the live resource `runner` (executor SyncRunner) "
                "or `tool_host` (executor ToolHost) to build_reward / RewardComposer"
            )
        return cls(tool_host)

    def image(self, example: Example) -> ImageInfo:
        """The example's image as the runner registers it (same content hash, same dataset id)."""
        image_id = example.meta.get("imageId") if isinstance(example.meta, dict) else None
        return self.host.images.add_file(example.image, image_id=image_id)

    def call(self, calls: Sequence[ToolCall]) -> list[Any]:
        """Answer all calls concurrently (the host batches them per tool). Each item is the result,
        a `ToolError` (the verifier asked something the tool refuses: that check does not apply) or
        a `ToolUnavailable` (our failure: the caller masks the programs that needed it)."""
        if not calls:
            return []
        if self._in_loop_thread():
            raise RuntimeError("ToolCaller.call was called on the tool host's own event loop; call it from a thread")

        async def gather() -> list[Any]:
            outs = await asyncio.gather(*(self.host.call(c) for c in calls), return_exceptions=True)
            return [_outcome(o) for o in outs]

        return asyncio.run_coroutine_threadsafe(gather(), self.loop).result()

    def _in_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def close(self) -> None:
        if self._own_thread is not None and self._own_thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._own_thread.join()
            self.loop.close()


def _outcome(out: Any) -> Any:
    if isinstance(out, tuple):
        return out[0]  # (result, cached, seconds)
    if isinstance(out, (ToolError, ToolUnavailable)):
        return out
    # Anything else escaping the host is the host breaking: our failure, never a score.
    return ToolUnavailable(f"tool host failure: {type(out).__name__}: {out}"[:MAX_MESSAGE])
