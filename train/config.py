"""Config parsing for entry scripts: dataclasses from a YAML file plus command-line overrides.

A thin layer over trl's `TrlParser` (`--config recipe.yaml --key value ...`): an unknown or
mistyped key, in the file or on the command line, fails before any work starts with the nearest
valid keys and the full list, instead of trl's bare "unknown arguments".
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    pass


def valid_keys(dataclass_types) -> list[str]:
    return sorted({f.name for cls in dataclass_types for f in dataclasses.fields(cls)})


def _unknown_key_error(unknown: list[str], valid: list[str], where: str) -> ConfigError:
    lines = [f"{where}: unknown key(s) {unknown}"]
    for key in unknown:
        near = difflib.get_close_matches(key, valid, n=3, cutoff=0.6)
        if near:
            lines.append(f"  {key!r}: did you mean {', '.join(near)}?")
    lines.append(f"valid keys: {', '.join(valid)}")
    return ConfigError("\n".join(lines))


def check_yaml_keys(path: str | Path, dataclass_types) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config must be a mapping of keys to values")
    valid = valid_keys(dataclass_types)
    unknown = sorted(k for k in data if k not in valid)
    if unknown:
        raise _unknown_key_error(unknown, valid, str(path))
    return data


def parse_config(dataclass_types, argv: list[str] | None = None):
    """Parse `--config FILE` and `--key value` overrides into instances of `dataclass_types`."""
    from trl import TrlParser

    argv = list(argv) if argv is not None else None
    if argv is not None and "--config" in argv:
        check_yaml_keys(argv[argv.index("--config") + 1], dataclass_types)
    parser = TrlParser(tuple(dataclass_types))
    parser.allow_abbrev = False  # `--learning_rat` must be an error, not silently `--learning_rate`
    valid = valid_keys(dataclass_types)
    try:
        return parser.parse_args_and_config(argv)
    except ValueError as exc:
        text = str(exc)
        if "not used by the HfArgumentParser" not in text and "Unknown arguments" not in text:
            raise
        unknown = sorted(
            {tok.lstrip("-").split("=")[0] for tok in text.split("[", 1)[-1].split("'") if tok.startswith("--")}
        )
        raise _unknown_key_error(unknown, valid, "command line") from None
