"""`LocalToolClient`: the API's tool client when a program runs in this process (tests, debugging).

It validates arguments, counts calls against a cap, optionally caches by content, and keeps the
trace of tool calls that ends up in `ExecutionResult.tool_calls`.
"""

from __future__ import annotations

import time
from typing import Any

from vprl.data.boxes import Box
from vprl.executor.program import program_line
from vprl.executor.results import ToolCallRecord, short_result
from vprl.executor.tools.base import ToolBackend
from vprl.executor.tools.calls import ToolCall, validate_call
from vprl.executor.tools.errors import ToolError


class LocalToolClient:
    def __init__(self, backend: ToolBackend, max_calls: int = 1000, cache: dict[str, Any] | None = None):
        self.backend = backend
        self.images = backend.images
        self.max_calls = max_calls
        self.cache = cache
        self.trace: list[ToolCallRecord] = []
        self.limit_hit = False
        self._backend_hash = backend.config_hash()

    def call(self, tool: str, image: str | None, box: Box | None, args: dict[str, Any]) -> Any:
        if len(self.trace) >= self.max_calls:
            # Remembered even if the program swallows the exception: the status is rpc_limit.
            self.limit_hit = True
            raise ToolError(f"the program made more than {self.max_calls} tool calls")
        call = validate_call(ToolCall(tool, image, tuple(box) if box else None, dict(args)), self.images)
        t0 = time.perf_counter()
        key = call.cache_key(self._backend_hash) if self.cache is not None else None
        cached = key is not None and key in self.cache
        result = self.cache[key] if cached else self.backend.run(tool, [call])[0]
        if key is not None and not cached:
            self.cache[key] = result
        self.trace.append(
            ToolCallRecord(
                tool,
                call.args,
                list(call.box) if call.box else None,
                short_result(result),
                cached,
                round(time.perf_counter() - t0, 6),
                program_line(),
            )
        )
        return result

    def pixels(self, image: str):
        return self.images.get(image).load_pixels()

    def register_pixels(self, pixels) -> tuple[str, int, int]:
        info = self.images.add_array(pixels)
        return info.ref, info.width, info.height
