"""Tool stacks: a YAML file (`configs/tools/*.yaml`) naming a backend and its settings, given by its
path or by its name (`"shapes"` is `configs/tools/shapes.yaml`)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml

from vprl.executor.tools.base import ToolBackend
from vprl.executor.tools.images import ImageStore
from vprl.paths import CHECKOUT

# Imported lazily: the `hf` backend pulls in torch and transformers, which the sandbox never needs.
BACKENDS: dict[str, str] = {
    "oracle": "vprl.executor.tools.oracle:OracleBackend",
    "shapes": "vprl.executor.tools.shapes:ShapesBackend",
    "hf": "vprl.executor.tools.hf:HFBackend",
}


# Settings that name files: a relative path is tried against the working directory, then against
# the folder of the YAML file that names it.
PATH_SETTINGS = frozenset({"scene_graphs"})


# Where a stack given by name is looked up, in order: stacks shipped inside the package (where the
# YAMLs must live for a non-editable install to carry them; `configs/` is no package) and the
# checkout's `configs/tools/`.
PACKAGED_STACKS = Path(__file__).resolve().parent / "stacks"
CHECKOUT_STACKS = CHECKOUT / "configs" / "tools" if CHECKOUT else None
STACK_DIRS: tuple[Path, ...] = tuple(d for d in (PACKAGED_STACKS, CHECKOUT_STACKS) if d is not None)


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
    return sorted({p.stem for d in STACK_DIRS if d.is_dir() for p in d.glob("*.yaml")})


def stack_path(ref: str | Path) -> Path:
    """The YAML file of a stack: `ref` itself when it exists, else the named stack of that name (a
    bare name such as `"viunit"`, no folder and no suffix). Fails naming what was looked for."""
    path = Path(ref)
    if path.exists():
        return path
    if len(path.parts) == 1 and not path.suffix:
        for folder in STACK_DIRS:
            if (folder / f"{path.name}.yaml").is_file():
                return folder / f"{path.name}.yaml"
        raise FileNotFoundError(
            f"tool stack {str(ref)!r}: no file of that name and no named stack; named stacks: {stack_names()}"
        )
    raise FileNotFoundError(
        f"tool stack {path} does not exist (stacks live in configs/tools/*.yaml; named: {stack_names()})"
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
