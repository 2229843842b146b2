"""Tool stacks: a YAML file naming a backend and its settings, given by its path (any YAML of the
user's) or by its name (`"shapes"` is `vprl/executor/tools/stacks/shapes.yaml`, shipped in the package)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml

from vprl.executor.tools.base import ToolBackend
from vprl.executor.tools.images import ImageStore
from vprl.paths import PACKAGE

# Imported lazily: the `hf` backend pulls in torch and transformers, which the sandbox never needs.
BACKENDS: dict[str, str] = {
    "oracle": "vprl.executor.tools.oracle:OracleBackend",
    "shapes": "vprl.executor.tools.shapes:ShapesBackend",
    "hf": "vprl.executor.tools.hf:HFBackend",
}


# Settings that name files: a relative path is tried against the working directory, then against
# the folder of the YAML file that names it.
PATH_SETTINGS = frozenset({"scene_graphs"})


# The stacks a name stands for: inside the package, so that a non-editable install carries them
# (`configs/` is no package and stays behind).
NAMED_STACKS = PACKAGE / "executor" / "tools" / "stacks"


def _resolve(value: Any, base: Path) -> Any:
    if isinstance(value, list):
        return [_resolve(v, base) for v in value]
    if isinstance(value, str) and not Path(value).is_absolute() and not Path(value).exists():
        return str(base / value)
    return value


def backend_class(name: str) -> type[ToolBackend]:
    if name not in BACKENDS:
        raise ValueError(f"unknown tool backend {name!r}; valid backends: {sorted(BACKENDS)}")
    module, attr = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def stack_names() -> list[str]:
    """The stacks that can be named without a path."""
    return sorted(p.stem for p in NAMED_STACKS.glob("*.yaml"))


def stack_path(ref: str | Path) -> Path:
    """The YAML file of a stack: `ref` itself when it exists, else the named stack of that name (a
    bare name such as `"viunit"`, no folder and no suffix). Fails naming what was looked for."""
    path = Path(ref)
    if path.exists():
        return path
    if len(path.parts) == 1 and not path.suffix:
        if (NAMED_STACKS / f"{path.name}.yaml").is_file():
            return NAMED_STACKS / f"{path.name}.yaml"
        raise FileNotFoundError(
            f"tool stack {str(ref)!r}: no file of that name and no named stack; named stacks: {stack_names()}"
        )
    raise FileNotFoundError(
        f"tool stack {path} does not exist (give a stack YAML's path or a named stack: {stack_names()})"
    )


def read_tool_stack(path: str | Path) -> dict[str, Any]:
    """Read and check a tool-stack YAML, by path or by name (`stack_path`); relative paths inside it
    are resolved against the file."""
    path = stack_path(path)
    with open(path, encoding="utf-8") as fh:
        config = yaml.safe_load(fh) or {}
    if not isinstance(config, dict) or "backend" not in config:
        raise ValueError(f"{path}: a tool stack must be a mapping with a 'backend' key ({sorted(BACKENDS)})")
    config["_source"] = str(path)
    return config


def stack_settings(config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A stack's backend settings with `overrides` applied: a mapping (one tool's section) is merged
    into the stack's, so `{"detect": {"box_threshold": 0.1}}` changes the threshold and keeps the model;
    anything else replaces the stack's value. The `serve:` section is the service's, not the backend's."""
    settings = {k: v for k, v in config.items() if k not in ("backend", "_source", "serve")}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(settings.get(key), dict):
            settings[key] = {**settings[key], **value}
        else:
            settings[key] = value
    return settings


def build_backend(
    config: dict[str, Any] | str | Path, images: ImageStore | None = None, **overrides: Any
) -> ToolBackend:
    """Instantiate the backend a stack names; `overrides` replace settings (e.g. scene graphs)."""
    if not isinstance(config, dict):
        config = read_tool_stack(config)
    settings = stack_settings(config, overrides)
    if "_source" in config:
        base = Path(config["_source"]).parent
        for key in PATH_SETTINGS & set(settings):
            settings[key] = _resolve(settings[key], base)
    cls = backend_class(config["backend"])
    where = config.get("_source", "tool stack")
    try:
        cls.check_settings(**settings)
        return cls(images if images is not None else ImageStore(), **settings)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: bad settings for the {config['backend']!r} backend: {exc}") from None
