"""How API objects reach the tools: through the `ToolClient` bound for the running program.

In-process (tests, debugging) the client calls a backend directly; inside the sandbox it is the
RPC channel to the tool host. The API code is the same either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

from vprl.data.boxes import Box


class ToolClient(Protocol):
    def call(self, tool: str, image: str | None, box: Box | None, args: dict[str, Any]) -> Any:
        """Run one tool call and return its JSON result (raises `ToolError` for bad arguments)."""

    def pixels(self, image: str):
        """The (H, W, 3) uint8 pixels of a registered image."""

    def register_pixels(self, pixels) -> tuple[str, int, int]:
        """Make an array the program built into a tool-visible image; returns (ref, width, height)."""


_client: ToolClient | None = None


def current_client() -> ToolClient:
    if _client is None:
        raise RuntimeError("no tool client is bound: run programs through vprl.executor.program.run_program")
    return _client


@contextlib.contextmanager
def bind_client(client: ToolClient) -> Iterator[ToolClient]:
    """Bind `client` for the API calls made inside the `with` block."""
    global _client
    previous, _client = _client, client
    try:
        yield client
    finally:
        _client = previous
