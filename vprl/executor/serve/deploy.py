"""Deploy a tool stack on Ray Serve: one application per tool, `<app_prefix><tool>`, each a
`ToolReplica` deployment placed as the stack's `serve:` section says. Nothing loads a model here:
each replica loads its tools' models in its constructor, on the GPUs Ray gives it, and `serve.run_many`
returns once every replica has, so a deployed stack answers its first call without a cold load."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from vprl.executor.serve.settings import ServeSettings, parse_serve
from vprl.executor.tools.calls import TOOLS
from vprl.executor.tools.stack import backend_class, read_tool_stack, stack_settings


class ServiceUnavailable(RuntimeError):
    """No Ray cluster, or no tool service, where one was named."""


def served_settings(stack: dict[str, Any]) -> ServeSettings:
    """What a stack deploys: the tools its backend configures, placed by its `serve:` section."""
    cls = backend_class(stack["backend"])
    settings = stack_settings(stack, {})
    cls.check_settings(**settings)
    return parse_serve(stack, cls.configured_tools(**settings))


def tool_stack(stack: dict[str, Any], tools: list[str]) -> dict[str, Any]:
    """The stack one deployment's replicas build: for the `hf` backend only its tools' sections (so a
    replica loads only their models), for the others the stack as it is."""
    if stack["backend"] != "hf":
        return stack
    return {k: v for k, v in stack.items() if k not in TOOLS or k in tools}


def connect(address: str | None) -> str:
    """Join the Ray cluster at `address` ("auto": the one started on this node with `ray start`), or
    start a local one when `address` is None; returns the cluster's address."""
    import ray

    if not ray.is_initialized():
        _reachable(address)
        try:
            # None means a cluster of our own: ray.init(address=None) would attach to whatever cluster
            # /tmp/ray/ray_current_cluster names, which a finished `ray start` leaves behind.
            ray.init(
                address="local" if address is None else address,
                ignore_reinit_error=True,
                log_to_driver=False,
                include_dashboard=False,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ServiceUnavailable(
                f"no Ray cluster at {address!r} ({exc}); start one with `ray start --head` and deploy the tools "
                "with `python -m vprl.executor.serve --tool_stack <stack> --address auto`"
            ) from None
    return ray.get_runtime_context().gcs_address


def _reachable(address: str | None) -> None:
    """A `host:port` that nothing answers fails now: Ray itself would keep retrying for minutes."""
    if not address or address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as exc:
        raise ServiceUnavailable(
            f"no Ray cluster at {address!r} ({exc}); start one with `ray start --head` and deploy the tools "
            "with `python -m vprl.executor.serve --tool_stack <stack> --address auto`"
        ) from None


def deploy(stack: str | Path | dict[str, Any], address: str | None = None) -> ServeSettings:
    """Deploy every tool of `stack`; returns the placement (application names, replicas, batching)."""
    from ray import serve

    from vprl.executor.serve.replica import ToolReplica

    stack = stack if isinstance(stack, dict) else read_tool_stack(stack)
    settings = served_settings(stack)
    connect(address)
    targets = []
    for name, placement in settings.placements.items():
        tools = settings.members[name]
        deployment = serve.deployment(ToolReplica).options(name=name, **placement.deployment_options())
        app = deployment.bind(
            tool_stack(stack, tools),
            tools,
            placement.max_batch_size,
            placement.batch_wait_timeout_s,
            placement.cache_size,
        )
        targets.append(serve.RunTarget(app, name=settings.app(name), route_prefix=None))
    # All at once, returning when every application runs: the replicas start (and load their models)
    # side by side rather than one application after another (six shapes tools: 55 s -> about 20 s).
    serve.run_many(targets)
    return settings


def undeploy(settings: ServeSettings, timeout_s: float = 60.0) -> None:
    """Delete every application of the stack; returns once they are gone."""
    from ray import serve

    names = {settings.app(name) for name in settings.placements}
    # All at once, as deploy starts them: one blocking delete after another waits about 3 s each.
    for name in names:
        serve.delete(name, _blocking=False)
    deadline = time.monotonic() + timeout_s
    while left := names & set(serve.status().applications):
        if time.monotonic() > deadline:
            raise TimeoutError(f"tool applications still there {timeout_s:.0f} s after their deletion: {sorted(left)}")
        time.sleep(0.1)
