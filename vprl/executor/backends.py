"""The tool backend a run uses: the stack's models in this process, or the same stack deployed as a
service on Ray Serve (`python -m vprl.executor.serve`) and reached through the `serve` backend, where
nothing is loaded here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vprl.executor.tools.base import ToolBackend
from vprl.executor.tools.images import ImageStore
from vprl.executor.tools.stack import build_backend, read_tool_stack


def open_backend(
    stack: dict[str, Any] | str | Path, images: ImageStore | None = None, service: str | None = None, **overrides: Any
) -> ToolBackend:
    """`service`: the Ray address of a cluster the stack is deployed in ("auto": this node's)."""
    if service is None:
        return build_backend(stack, images, **overrides)
    if overrides:
        raise ValueError(
            f"tool overrides {sorted(overrides)} cannot change a deployed tool service; put them in the stack "
            "and deploy it again"
        )
    from vprl.executor.serve.client import ServedBackend

    config = stack if isinstance(stack, dict) else read_tool_stack(stack)
    return ServedBackend(images if images is not None else ImageStore(), stack=config, address=service)
