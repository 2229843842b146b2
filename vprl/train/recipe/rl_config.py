"""The RL recipe: one flat YAML file plus `--key value` overrides, parsed once into an `RLConfig`.

The recipe is flat (trl's `TrlParser` style): every key belongs to exactly one section
(`vprl.train.recipe.sections`) or to the trainer's arguments (`vprl.train.recipe.trainer_args`: trl's
`GRPOConfig`, `RLOOConfig`, or `SFTConfig` for `rest`). `algorithm` picks the trainer arguments, so
a GRPO-only key in an RLOO recipe is an unknown key, listed with the valid ones.

List and mapping values (`rewards`, `reward_penalties`, `dataset_options`, `dataset_mixture`,
`tool_overrides`, `rest_vllm_kwargs`) come as YAML structures from the file or as JSON/YAML text on the command line;
their fields are typed `str | None` for the argument parser's sake and hold the parsed structure
after `parse_rl_config` (`dataset_mixture` a `vprl.train.recipe.mixture.Mixture`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from vprl.train.recipe.mixture import KEY as MIXTURE_KEY
from vprl.train.recipe.mixture import parse_mixture
from vprl.train.recipe.parsing import CommandLine, ConfigError, parse_config, structured, yaml_place
from vprl.train.recipe.sections import (
    DataArgs,
    ExecutorArgs,
    PolicyArgs,
    PromptArgs,
    RepairArgs,
    RestArgs,
    RewardArgs,
    RunArgs,
    SamplingArgs,
    accumulation_for,
)
from vprl.train.recipe.trainer_args import TRAINER_ARGS

ALGORITHMS = tuple(TRAINER_ARGS)


# Trainer fields that `__post_init__` derives from others; writing them back would over-determine.
DERIVED = frozenset({"generation_batch_size"})

SECTIONS = {
    "policy": PolicyArgs,
    "data": DataArgs,
    "prompt": PromptArgs,
    "executor": ExecutorArgs,
    "rewards": RewardArgs,
    "repair": RepairArgs,
    "run": RunArgs,
    "rest": RestArgs,
    "sampling": SamplingArgs,
}
# Sections only ReST recipes take: GRPO and RLOO give the sampling keys to trl's own arguments.
REST_ONLY = ("rest", "sampling")


@dataclass
class RLConfig:
    policy: PolicyArgs
    data: DataArgs
    prompt: PromptArgs
    executor: ExecutorArgs
    rewards: RewardArgs
    repair: RepairArgs
    run: RunArgs
    rest: RestArgs
    sampling: SamplingArgs
    training: Any  # GRPOArgs | RLOOArgs | SFTArgs

    @property
    def algorithm(self) -> str:
        return self.run.algorithm

    def to_flat(self) -> dict[str, Any]:
        """The resolved recipe: one flat mapping that `--config` reads back."""
        out: dict[str, Any] = {}
        for name in sections_of(self.algorithm):
            out.update(dataclasses.asdict(getattr(self, name)))
        training = self.training.to_dict()
        init = {f.name for f in dataclasses.fields(self.training) if f.init}
        out.update({k: v for k, v in training.items() if k in init and k not in DERIVED})
        return _plain(out)

    def flat_defaults(self) -> dict[str, Any]:
        """Each key of `to_flat` that has a default, with it (a run folder written before a key existed
        ran as its default says)."""
        out: dict[str, Any] = {}
        for section in [getattr(self, name) for name in sections_of(self.algorithm)] + [self.training]:
            for f in dataclasses.fields(section):
                if f.default is not dataclasses.MISSING:
                    out[f.name] = f.default
                elif f.default_factory is not dataclasses.MISSING:
                    out[f.name] = f.default_factory()
        return _plain(out)


def _plain(value: Any) -> Any:
    """YAML-safe plain values (tuples to lists, enums already resolved by `to_dict`)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def sections_of(algorithm: str) -> list[str]:
    return [name for name in SECTIONS if algorithm == "rest" or name not in REST_ONLY]


def parse_rl_config(
    argv: list[str] | None = None, prog: str | None = None, description: str | None = None
) -> RLConfig:
    """Parse `--config recipe.yaml [--key value ...]` into an `RLConfig` (no files are touched
    beyond the recipe; `vprl.train.recipe.checks.validate` checks what the values name)."""
    line = CommandLine.read(argv)
    algorithm = line.value("algorithm") or "grpo"
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm: {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    names = sections_of(algorithm)
    types = [*(SECTIONS[name] for name in names), TRAINER_ARGS[algorithm]]
    line, processes = _with_global_batch(line, TRAINER_ARGS[algorithm])
    parsed = parse_config(types, line, prog=prog, description=description)
    sections = dict(zip([*names, "training"], parsed[: len(types)], strict=True))
    if algorithm != "rest":
        sections.update(rest=RestArgs(), sampling=SamplingArgs.of_trainer(sections["training"]))
    cfg = RLConfig(**sections)
    if processes is not None and cfg.training.world_size != processes:
        raise ConfigError(
            f"global_batch_size: planned for {processes} process(es) (WORLD_SIZE), but the trainer runs "
            f"{cfg.training.world_size}; start the run with accelerate launch or torchrun"
        )
    cfg.rewards.rewards = structured(cfg.rewards.rewards, "rewards", list) or ["correctness"]
    cfg.rewards.reward_penalties = structured(cfg.rewards.reward_penalties, "reward_penalties", dict)
    cfg.data.dataset_options = structured(cfg.data.dataset_options, "dataset_options", dict) or {}
    mixture = structured(cfg.data.dataset_mixture, MIXTURE_KEY, dict)
    if mixture is not None:
        cfg.data.dataset_mixture = parse_mixture(mixture, _place(line, MIXTURE_KEY))
        check_single_keys(cfg.data, line)
    cfg.rest.rest_vllm_kwargs = structured(cfg.rest.rest_vllm_kwargs, "rest_vllm_kwargs", dict) or {}
    if cfg.training.output_dir is None:
        raise ConfigError("output_dir: required (the run folder: checkpoints, adapter, rollouts, manifest)")
    return cfg


def _with_global_batch(line: CommandLine, trainer_args: type) -> tuple[CommandLine, int | None]:
    """The command line with the gradient_accumulation_steps that `global_batch_size` asks for at
    the launcher's world size, and that world size (None without `global_batch_size`). Decided
    before the one parse, as trl derives steps_per_generation and generation_batch_size from it in
    `__post_init__`; a value the parser will refuse is left to it."""
    given = line.value("global_batch_size")
    if given is None:
        return line, None
    default = next(f.default for f in dataclasses.fields(trainer_args) if f.name == "per_device_train_batch_size")
    try:
        global_batch = int(given)
        per_device = int(line.value("per_device_train_batch_size") or default)
    except (TypeError, ValueError):
        return line, None
    if global_batch < 1 or per_device < 1:
        return line, None
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    accumulation = accumulation_for(global_batch, per_device, processes)
    overrides = [*line.overrides, "--gradient_accumulation_steps", str(accumulation)]
    return CommandLine(line.path, line.data, overrides), processes


# The one-dataset keys a mixture's entries replace, with the value each has when it was not given.
SINGLE_KEYS = {
    "dataset": "shapes",
    "dataset_split": None,
    "dataset_tasks": ["train"],
    "dataset_sample": None,
    "dataset_limit": None,
    "dataset_options": {},
    "dataset_labels": True,
}


def check_single_keys(data: DataArgs, line: CommandLine) -> None:
    """With a mixture, the one-dataset keys must keep their defaults: each entry has its own."""
    for key, default in SINGLE_KEYS.items():
        if getattr(data, key) != default:
            entry_key = key.removeprefix("dataset_") if key != "dataset" else "dataset"
            raise ConfigError(
                f"{_place(line, key)}: {key}: a recipe with {MIXTURE_KEY} sets it per entry ({entry_key}: ...)"
            )


def _place(line: CommandLine, key: str) -> str:
    typed = any(tok == f"--{key}" or tok.startswith(f"--{key}=") for tok in line.overrides)
    return "command line" if typed or line.path is None else yaml_place(line.path, key)
