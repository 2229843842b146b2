"""The one door to a tool backend: every command, trainer and benchmark gets its backend here
(`open_backend`), and checks a stack before it starts anything here (`check_backend`), so a stack
means the same to all of them.

A stack is a name (`"shapes"`, `"viunit"`: the YAMLs shipped in vprl/executor/tools/stacks/), the
path of any stack YAML, or a stack already read (a mapping, as a run's manifest records it). Its
models load in this process, or it is the same stack deployed as a service on Ray Serve
(`python -m vprl.executor.serve`) and reached through the `serve` backend, where nothing is loaded
here. `vprl.executor.tools.stack.build_backend` is the constructor behind the door; the tool service
builds its replicas' backends with it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vprl.executor.tools.base import ToolBackend
from vprl.executor.tools.images import ImageStore
from vprl.executor.tools.stack import backend_class, build_backend, read_tool_stack, stack_settings

Stack = dict[str, Any] | str | Path


def read_stack(stack: Stack) -> dict[str, Any]:
    """The stack's YAML read (by name or path), or the mapping as it is."""
    return stack if isinstance(stack, dict) else read_tool_stack(stack)


def run_overrides(
    config: dict[str, Any],
    overrides: dict[str, Any],
    service: str | None = None,
    worlds: Sequence[str | Path] = (),
) -> dict[str, Any]:
    """The settings a stack runs with besides its own: `overrides`, after the two rules every caller
    follows. A deployed stack runs as it was deployed, so it takes none. The oracle answers from scene
    graphs: with neither the stack nor the overrides naming any, it reads those of the shapes `worlds`
    (a shapes run's own), and fails without worlds."""
    overrides = dict(overrides)
    if service is not None:
        if overrides:
            raise ValueError(
                f"tool_overrides {sorted(overrides)}: a deployed tool service runs the stack as it was deployed; "
                "put them in the stack and deploy it again"
            )
        return overrides
    if config["backend"] == "oracle" and not any(
        overrides.get(k) or config.get(k) for k in ("scene_graphs", "scenes")
    ):
        if not worlds:
            raise ValueError(
                f"{config.get('_source', 'tool stack')}: the oracle backend needs `scene_graphs:` "
                "(in the stack, or tool_overrides: {scene_graphs: PATH})"
            )
        from vprl.data.shapes.tasks import scene_graph_files

        overrides["scene_graphs"] = [str(p) for root in worlds for p in scene_graph_files(root)]
    return overrides


def _backend_class(config: dict[str, Any]) -> type[ToolBackend]:
    try:
        return backend_class(config["backend"])
    except ValueError as exc:
        raise ValueError(f"{config.get('_source', 'tool stack')}: {exc}") from None


def check_backend(
    stack: Stack, service: str | None = None, *, worlds: Sequence[str | Path] = (), **overrides: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What `open_backend` would run, checked without loading any model or reaching any service: the
    stack read and the settings it runs with. Fails in one line naming the stack's file and the bad
    setting (a missing stack: FileNotFoundError; anything else: ValueError)."""
    config = read_stack(stack)
    cls = _backend_class(config)
    overrides = run_overrides(config, overrides, service, worlds)
    if service is None:  # a deployed stack's settings were checked when it was deployed
        try:
            cls.check_settings(**stack_settings(config, overrides))
        except (TypeError, ValueError) as exc:
            where = config.get("_source", "tool stack")
            raise ValueError(f"{where}: bad settings for the {config['backend']!r} backend: {exc}") from None
    return config, overrides


def open_backend(
    stack: Stack,
    images: ImageStore | None = None,
    service: str | None = None,
    *,
    worlds: Sequence[str | Path] = (),
    **overrides: Any,
) -> ToolBackend:
    """The stack's backend. `service`: the Ray address of a cluster the stack is deployed in ("auto":
    this node's); `worlds`: shapes worlds whose scene graphs an oracle without any reads; `overrides`
    replace the stack's settings (a mapping is merged into a tool's section)."""
    config = read_stack(stack)
    _backend_class(config)
    overrides = run_overrides(config, overrides, service, worlds)
    if service is None:
        return build_backend(config, images, **overrides)
    from vprl.executor.serve.client import ServedBackend

    return ServedBackend(images if images is not None else ImageStore(), stack=config, address=service)
