"""The tool backend protocol: batched calls on (image, box) pairs.

A backend answers a list of `ToolCall`s of one tool at once (so GPU backends can batch), reading
pixels from the shared `ImageStore`; the calls, the tools and their results are described in
`vprl.executor.tools.calls`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import typing
from typing import Any, ClassVar

from vprl.data.typed import mismatch
from vprl.executor.tools.calls import TOOLS, ToolCall
from vprl.executor.tools.errors import ToolUnavailable
from vprl.executor.tools.images import ImageStore


class ToolBackend:
    """Base class of tool backends. Subclasses implement the tools they support as batched methods
    `detect(calls) -> list`, `vqa(calls) -> list`, ... each returning one JSON result per call.
    """

    name: ClassVar[str] = ""
    # How many batches the tool host may have in flight at once: one for a backend that owns its
    # models (a second would only contend for the same device), more for one that forwards calls.
    max_concurrent_batches: ClassVar[int] = 1

    def __init__(self, images: ImageStore, **config: Any) -> None:
        self.images = images
        self.config = config

    @classmethod
    def check_settings(cls, **settings: Any) -> None:
        """Raise ValueError naming what a stack's settings get wrong, without loading anything.
        Backends with explicit keyword settings are checked against their signature; a backend that
        takes a free-form mapping overrides this."""
        params = inspect.signature(cls.__init__).parameters
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return
        valid = [name for name in params if name not in ("self", "images")]
        unknown = sorted(set(settings) - set(valid))
        if unknown:
            raise ValueError(f"the {cls.name!r} backend: unknown setting(s) {unknown}; valid: {valid}")
        hints = typing.get_type_hints(cls.__init__)
        for key, value in settings.items():
            problem = mismatch(value, hints[key]) if key in hints else None
            if problem:
                raise ValueError(f"the {cls.name!r} backend: {key}: expected {problem}, got {value!r:.60}")

    @classmethod
    def configured_tools(cls, **settings: Any) -> list[str]:
        """The tools a stack with these settings answers (all the backend implements, by default)."""
        return [tool for tool in TOOLS if callable(getattr(cls, tool, None))]

    def config_hash(self) -> str:
        """Identifies the backend and its settings in cache keys; any change invalidates the cache."""
        blob = json.dumps([self.name, self.config], sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]

    def supports(self, tool: str) -> bool:
        return callable(getattr(self, tool, None)) and tool in TOOLS

    def preload(self) -> list[str]:
        """Load every model (and slow library) the backend's tools use, before the first call, so a
        cold load is never counted against a call's timeout; returns what it loaded. By default
        nothing: a backend that loads nothing lazily has nothing to do."""
        return []

    def run(self, tool: str, calls: list[ToolCall]) -> list[Any]:
        if not self.supports(tool):
            raise ToolUnavailable(f"the {self.name!r} backend has no {tool!r} tool")
        results = getattr(self, tool)(calls)
        if len(results) != len(calls):
            raise ToolUnavailable(f"{self.name}.{tool} returned {len(results)} results for {len(calls)} calls")
        return results
