"""Config parsing for every command: dataclasses from one YAML file plus `--key value` overrides.

trl's `TrlParser` style (`--config recipe.yaml --key value ...`), with two differences: the file is
read once, here, and an unknown or mistyped key (in the file or on the command line) fails before
any work starts with the nearest valid keys and the full list, instead of a bare "unknown
arguments". A mapping under `env:` sets environment variables, as in trl.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from vprl.data.cli import fail
from vprl.data.ranges import key_problem
from vprl.data.retired_names import retired_message


class ConfigError(ValueError):
    pass


def valid_keys(dataclass_types) -> list[str]:
    return sorted({f.name for cls in dataclass_types for f in dataclasses.fields(cls)})


def unknown_key_error(unknown: list[str], valid: list[str], where: str) -> ConfigError:
    """The nearest valid keys and the full list; a retired name alone names its replacement."""
    for key in unknown:
        message = retired_message(key, set(valid))
        if message:
            return ConfigError(f"{where}: {message}")
    lines = [f"{where}: unknown key(s) {unknown}"]
    for key in unknown:
        near = difflib.get_close_matches(key, valid, n=3, cutoff=0.6)
        if near:
            lines.append(f"  {key!r}: did you mean {', '.join(near)}?")
    lines.append(f"valid keys: {', '.join(valid)}")
    return ConfigError("\n".join(lines))


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A config file's mapping; a missing file, bad YAML or a non-mapping is a ConfigError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config must be a mapping of keys to values")
    return data


@dataclasses.dataclass(frozen=True)
class CommandLine:
    """`argv` split into the config file (read) and the `--key value` overrides."""

    path: Path | None
    data: dict[str, Any]
    overrides: list[str]

    @classmethod
    def read(cls, argv: Sequence[str] | None = None) -> CommandLine:
        args = list(sys.argv[1:] if argv is None else argv)
        for i, tok in enumerate(args):
            if tok == "--config" or tok.startswith("--config="):
                path = tok.split("=", 1)[1] if "=" in tok else (args[i + 1] if i + 1 < len(args) else "")
                if not path:
                    raise ConfigError("--config needs a file")
                rest = args[:i] + args[i + (1 if "=" in tok else 2) :]
                return cls(Path(path), read_yaml(path), rest)
        return cls(None, {}, args)

    def value(self, key: str) -> Any:
        """A key's value as given: the last `--key` on the command line, else the file's, else None."""
        found = self.data.get(key)
        for i, tok in enumerate(self.overrides):
            if tok == f"--{key}" and i + 1 < len(self.overrides):
                found = self.overrides[i + 1]
            elif tok.startswith(f"--{key}="):
                found = tok.split("=", 1)[1]
        return found


def parse_config(
    dataclass_types,
    argv: Sequence[str] | CommandLine | None = None,
    *,
    prog: str | None = None,
    description: str | None = None,
):
    """Parse `--config FILE` and `--key value` overrides into instances of `dataclass_types`.
    `prog` and `description` head the command's `--help`."""
    from trl import TrlParser

    line = argv if isinstance(argv, CommandLine) else CommandLine.read(argv)
    data = dict(line.data)
    env = data.pop("env", None) or {}
    if not isinstance(env, dict):
        raise ConfigError(f"{line.path}: `env` must be a mapping of variable names to values")
    valid = valid_keys(dataclass_types)
    unknown = sorted(k for k in data if k not in valid)
    for key in unknown:
        message = retired_message(key, set(valid))
        if message and line.path is not None:
            raise ConfigError(f"{yaml_place(line.path, key)}: {message}")
    if unknown:
        raise unknown_key_error(unknown, valid, str(line.path))
    for key, value in env.items():
        os.environ[str(key)] = str(value)
    for cls in dataclass_types:
        if not hasattr(cls, "_argument_group_name"):  # HfArgumentParser puts each class's keys under it
            cls._argument_group_name = _group_name(cls)
    parser = TrlParser(tuple(dataclass_types), exit_on_error=False)
    parser.allow_abbrev = False  # `--learning_rat` must be an error, not silently `--learning_rate`
    parser.prog = prog or parser.prog
    parser.description = description
    # Read by `CommandLine` before argparse sees the line; declared so that `--help` lists it.
    parser.add_argument("--config", metavar="FILE", help="YAML file of these keys; --key value overrides it")
    parser.set_defaults_with_config(**data)
    try:
        *parsed, remaining = parser.parse_args_into_dataclasses(args=line.overrides, return_remaining_strings=True)
        parsed = parsed[: len(dataclass_types)]  # the namespace left over holds `config`
    except argparse.ArgumentError as exc:
        raise _value_error(exc, line) from None
    except ValueError as exc:  # a dataclass's own check of its values
        where = " + ".join(([str(line.path)] if line.path else []) + (["command line"] if line.overrides else []))
        raise ConfigError(f"{where or 'defaults'}: {exc}") from None
    if remaining:
        unknown = sorted({tok.lstrip("-").split("=")[0] for tok in remaining if tok.startswith("--")}) or remaining
        raise unknown_key_error(unknown, valid, "command line")
    check_ranges(parsed, line)
    return tuple(parsed)


def check_ranges(parsed: Sequence[Any], line: CommandLine) -> None:
    """Every numeric key the user gave is in its range (`vprl.data.ranges`); named where it was written."""
    given = set(line.data) | {tok[2:].split("=")[0] for tok in line.overrides if tok.startswith("--")}
    for instance in parsed:
        for f in dataclasses.fields(instance):
            if f.name not in given:
                continue
            default = f.default if f.default is not dataclasses.MISSING else None
            problem = key_problem(f.name, getattr(instance, f.name), default)
            if problem:
                raise ConfigError(f"{_place(f.name, line)}: {f.name}: {problem}")


def _place(key: str, line: CommandLine) -> str:
    typed = any(tok == f"--{key}" or tok.startswith(f"--{key}=") for tok in line.overrides)
    if typed or line.path is None:
        return "command line"
    return yaml_place(line.path, key)


def _group_name(cls: type) -> str:
    """The `--help` heading of a class's keys: `policy keys` for `PolicyArgs`; the trainer's
    arguments (trl/transformers classes) say whose they are."""
    library = next(
        (base for base in cls.__mro__[1:] if base.__module__.split(".")[0] in ("trl", "transformers")), None
    )
    if library is not None:
        return f"trainer keys ({library.__module__.split('.')[0]}'s {library.__name__}, with the recipe's defaults)"
    name = cls.__name__.removesuffix("Args").removesuffix("Config")
    return f"{name.lower() or cls.__name__} keys"


def _value_error(exc: argparse.ArgumentError, line: CommandLine) -> ConfigError:
    """A value argparse could not read, named where it was written: the file and line, or the
    command line."""
    key = (exc.argument_name or "").split("/")[0].lstrip("-")
    place = _place(key, line)
    return ConfigError(f"{place}: {'--' if place == 'command line' else ''}{key}: {exc.message}")


def yaml_place(path: Path, key: str) -> str:
    """`file:line` of a top-level key in a YAML file (the file alone when it is not found)."""
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if text.startswith(f"{key}:"):
            return f"{path}:{number}"
    return str(path)


def structured(value: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    """A list/mapping option: as given in YAML, or parsed from command-line text (JSON or YAML)."""
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{key}: cannot parse {value!r}: {exc}") from None
    if value is not None and not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ConfigError(f"{key}: expected a {names}, got {type(value).__name__} {value!r:.80}")
    return value


def run_command(main: Any) -> None:
    """A command's `__main__`: a `ConfigError` (bad input, found before any work) ends it with its
    message and exit status 2 (`vprl.data.cli`); anything else keeps its traceback. A returned int is the
    exit status."""
    try:
        status = main()
    except ConfigError as exc:
        fail(str(exc))
    sys.exit(status if isinstance(status, int) else 0)
