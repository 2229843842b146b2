"""The `serve:` section of a tool stack: where each tool's deployment runs and how it batches.

    serve:
      app_prefix: vprl-             # each deployment is the Serve application <app_prefix><name>
      tools: [detect, vqa, caption] # default: every tool the stack configures
      groups: {blip2: [vqa, caption]}   # tools that share one model share one deployment
      default: {num_replicas: 1, num_gpus: 0}
      detect: {num_gpus: 0.25}
      blip2: {num_gpus: 0.5, autoscaling: {min_replicas: 1, max_replicas: 4}}

A tool in no group is a deployment of its own, named after it. Per deployment: `num_replicas` or
`autoscaling` (Ray Serve's `autoscaling_config`), `num_gpus` and
`num_cpus` per replica (fractions allowed), `max_batch_size` and `batch_wait_timeout_s` of
`@serve.batch` (default: the tool's `max_batch_size` in the stack, else 8, and 10 ms), and
`max_ongoing_requests`, at least the batch size: Serve's default of 5 would cap every batch at 5.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from vprl.executor.tools.calls import TOOLS

DEFAULT_PREFIX = "vprl-"


@dataclass(frozen=True)
class ToolPlacement:
    num_replicas: int = 1
    autoscaling: dict[str, Any] | None = None
    num_gpus: float = 0.0
    num_cpus: float = 0.0
    max_batch_size: int = 8
    batch_wait_timeout_s: float = 0.01
    max_ongoing_requests: int | None = None  # None: four batches' worth
    cache_size: int = 200_000

    def __post_init__(self) -> None:
        if self.num_replicas < 1 or self.max_batch_size < 1:
            raise ValueError("num_replicas and max_batch_size must be >= 1")
        if self.num_gpus < 0 or self.num_cpus < 0 or self.batch_wait_timeout_s < 0:
            raise ValueError("num_gpus, num_cpus and batch_wait_timeout_s must be >= 0")
        if isinstance(self.autoscaling, dict) and self.autoscaling.get("min_replicas", 1) < 1:
            # A replica started by a call loads its model inside that call's timeout: infra_error.
            raise ValueError(
                "autoscaling.min_replicas must be >= 1: a replica started on demand loads its model during a call"
            )
        if self.max_ongoing_requests is not None and self.max_ongoing_requests < self.max_batch_size:
            raise ValueError(
                f"max_ongoing_requests ({self.max_ongoing_requests}) below max_batch_size ({self.max_batch_size}) "
                "would cap every batch at it"
            )

    @property
    def ongoing(self) -> int:
        return self.max_ongoing_requests or 4 * self.max_batch_size

    def deployment_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "max_ongoing_requests": self.ongoing,
            "ray_actor_options": {"num_gpus": self.num_gpus, "num_cpus": self.num_cpus},
        }
        if self.autoscaling:
            options["autoscaling_config"] = dict(self.autoscaling)
        else:
            options["num_replicas"] = self.num_replicas
        return options


@dataclass(frozen=True)
class ServeSettings:
    app_prefix: str = DEFAULT_PREFIX
    placements: dict[str, ToolPlacement] = field(default_factory=dict)  # deployment -> placement
    members: dict[str, list[str]] = field(default_factory=dict)  # deployment -> the tools it answers

    def app(self, deployment: str) -> str:
        return self.app_prefix + deployment

    def app_of(self, tool: str) -> str:
        return self.app(self.deployment_of(tool))

    def deployment_of(self, tool: str) -> str:
        return next(name for name, tools in self.members.items() if tool in tools)

    @property
    def tools(self) -> list[str]:
        return [tool for tools in self.members.values() for tool in tools]


_PLACEMENT_KEYS = [f.name for f in dataclasses.fields(ToolPlacement)]


def parse_serve(stack: dict[str, Any], tools: list[str]) -> ServeSettings:
    """The stack's `serve:` section for `tools` (the tools its backend configures); a bad key or value
    is a ValueError naming it."""
    where = f"{stack.get('_source', 'tool stack')}: serve"
    section = stack.get("serve") or {}
    if not isinstance(section, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(section).__name__}")
    groups = section.get("groups") or {}
    if not isinstance(groups, dict) or not all(isinstance(v, list) for v in groups.values()):
        raise ValueError(f"{where}.groups: expected a mapping of names to lists of tools")
    known = {"app_prefix", "tools", "groups", "default", *TOOLS, *groups}
    unknown = sorted(set(section) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; valid keys: {sorted(known)}")
    chosen = list(section.get("tools") or tools)
    missing = sorted(set(chosen) - set(tools))
    if missing:
        raise ValueError(f"{where}.tools: {missing} are not tools this stack configures ({', '.join(tools)})")
    grouped = [t for members in groups.values() for t in members]
    strays = sorted(set(grouped) - set(chosen))
    twice = sorted({t for t in grouped if grouped.count(t) > 1})
    if strays or twice:
        raise ValueError(f"{where}.groups: {strays or twice} {'not served' if strays else 'in two groups'}")
    members = {name: list(group) for name, group in groups.items()}
    members.update({tool: [tool] for tool in chosen if tool not in grouped})
    default = section.get("default") or {}
    placements = {}
    for name, group in members.items():
        batch = max((_batch_default(stack, tool) for tool in group), key=lambda d: d.get("max_batch_size", 0))
        values = {**batch, **default, **(section.get(name) or {})}
        bad = sorted(set(values) - set(_PLACEMENT_KEYS))
        if bad:
            raise ValueError(f"{where}.{name}: unknown key(s) {bad}; valid keys: {_PLACEMENT_KEYS}")
        try:
            placements[name] = ToolPlacement(**values)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}.{name}: {exc}") from None
    return ServeSettings(str(section.get("app_prefix", DEFAULT_PREFIX)), placements, members)


def _batch_default(stack: dict[str, Any], tool: str) -> dict[str, Any]:
    """The batch size the stack gives the tool in-process (`hf` sections carry `max_batch_size`)."""
    block = stack.get(tool)
    if isinstance(block, dict) and isinstance(block.get("max_batch_size"), int):
        return {"max_batch_size": block["max_batch_size"]}
    return {}
