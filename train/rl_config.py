"""The RL entry point's config: dataclass sections read from one flat YAML recipe plus `--key value`.

The recipe is flat (trl's `TrlParser` style): every key belongs to exactly one section below or to
the trainer's arguments (trl's `GRPOConfig`, `RLOOConfig`, or `SFTConfig` for `rest`, with the
ViUniT LoRA recipe's defaults). `algorithm` picks the trainer arguments, so a GRPO-only key in an
RLOO recipe is an unknown key, listed with the valid ones.

List and mapping values (`rewards`, `reward_penalties`, `dataset_options`, `tool_overrides`) come
as YAML structures from the file or as JSON/YAML text on the command line; their fields are typed
`str | None` for the argument parser's sake and hold the parsed structure after `parse_rl_config`.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from trl import GRPOConfig, RLOOConfig, SFTConfig

from train.config import ConfigError, parse_config

ALGORITHMS = ("grpo", "rloo", "rest")
DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


@dataclass
class PolicyArgs:
    """The policy: a causal code LM (local folder or hub id) with a LoRA adapter."""

    model_name_or_path: str | None = field(default=None, metadata={"help": "policy model folder or hub id"})
    policy_name: str | None = field(default=None, metadata={"help": "name in manifests and rollouts"})
    adapter_path: str | None = field(default=None, metadata={"help": "start from this LoRA adapter"})
    framing: str = field(default="auto", metadata={"help": "prompt framing: auto | plain | chat"})
    torch_dtype: str = field(default="auto", metadata={"help": "auto | float32 | bfloat16 | float16"})
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target_modules: list[str] = field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))
    load_in_4bit: bool = field(default=False, metadata={"help": "QLoRA: 4-bit base through bitsandbytes"})
    bnb_4bit_quant_type: str = "nf4"
    bnb_4bit_compute_dtype: str = "bfloat16"
    bnb_4bit_use_double_quant: bool = True


@dataclass
class DataArgs:
    dataset: str = field(default="shapes", metadata={"help": "'shapes' (the shapes world) or a loader name"})
    dataset_root: str | None = field(default=None, metadata={"help": "dataset folder (shapes: world root)"})
    dataset_split: str | None = field(default=None, metadata={"help": "loader split (None: its default)"})
    dataset_tasks: list[str] = field(default_factory=lambda: ["train"], metadata={"help": "shapes-world tasks"})
    dataset_sample: str | None = field(
        default=None, metadata={"help": "papers' sampling recipe: gqa_train | gqa_eval | okvqa | vqav2"}
    )
    dataset_sample_seed: int = 0
    dataset_limit: int | None = field(default=None, metadata={"help": "keep the first N examples"})
    dataset_options: str | None = field(default=None, metadata={"help": "loader keyword options (mapping)"})


@dataclass
class PromptArgs:
    """`train.prompts.PromptConfig` fields, prefixed; `prompt_task` None takes the examples' task."""

    prompt_variant: str = "vipergpt"
    prompt_task: str | None = None
    prompt_ice_file: str | None = field(default=None, metadata={"help": "in-context examples or an ACE file"})
    prompt_max_ices: int | None = None
    prompt_include_guidelines: bool = True
    prompt_layout: str = "stanic"
    prompt_return_annotation: str | None = None


@dataclass
class ExecutorArgs:
    tool_stack: str = field(default="configs/tools/shapes.yaml", metadata={"help": "configs/tools/*.yaml"})
    tool_overrides: str | None = field(default=None, metadata={"help": "backend settings replacing the stack's"})
    executor_slots: int | None = field(default=None, metadata={"help": "sandboxes in parallel (None: cores)"})
    executor_timeout_s: float = 5.0
    executor_sandbox: str = field(default="full", metadata={"help": "full | none (debugging only)"})
    executor_max_rpcs: int = 200


@dataclass
class RewardArgs:
    rewards: str | None = field(
        default=None, metadata={"help": "list of reward names or {name, weight, settings} (default: correctness)"}
    )
    reward_penalties: str | None = field(default=None, metadata={"help": "status -> total for failed programs"})
    filter_zero_variance: bool = field(
        default=False, metadata={"help": "drop groups whose rewards are all equal from the loss"}
    )
    stop_at_program_end: bool = field(
        default=True, metadata={"help": "cut completions at the first stop sequence after the function"}
    )
    overlap_execution: bool = field(
        default=True, metadata={"help": "run the programs while trl computes log-probabilities, not after"}
    )
    rollout_traces: bool = field(default=True, metadata={"help": "keep tool-call traces in rollouts.jsonl"})
    program_table_steps: int = field(default=50, metadata={"help": "wandb table of programs every N steps"})


@dataclass
class RunArgs:
    algorithm: str = field(default="grpo", metadata={"help": "grpo | rloo | rest"})
    resume: bool = field(default=True, metadata={"help": "resume from the last checkpoint in output_dir"})


@dataclass
class RestArgs:
    """The ReST loop (ViUniT/ViReP), mapped onto `train.rest.RestConfig`. Its optimisation settings
    come from the trainer arguments (learning_rate, lr_scheduler_type, warmup_steps, max_grad_norm,
    num_train_epochs, per_device_train_batch_size, gradient_accumulation_steps, max_length, seed);
    sampling from `rest_temperature`, `rest_top_p`, `rest_max_new_tokens`."""

    rest_iterations: int = 3
    rest_samples_per_query: int = 8
    rest_keep_threshold: float = field(default=0.0, metadata={"help": "keep programs whose total passes this"})
    rest_keep_rule: str = field(default="above", metadata={"help": "above (>) | at_least (>=)"})
    rest_dedupe: bool = True
    rest_max_kept_per_query: int | None = None
    rest_restart_from_base: bool = False
    rest_generator: str = field(default="hf", metadata={"help": "hf (transformers) | vllm (offline engine)"})
    rest_generation_batch_size: int = field(default=16, metadata={"help": "prompts x samples per HF batch"})
    rest_vllm_kwargs: str | None = field(default=None, metadata={"help": "vllm.LLM arguments (mapping)"})
    rest_temperature: float = 1.0
    rest_top_p: float = 0.9
    rest_max_new_tokens: int = 320


# The ViUniT recipe's defaults (lr 2e-4, linear schedule, warmup 0.1, max grad norm 0.3) and the
# papers' sampling (temperature 1.0, top-p 0.9, 320 new tokens) over trl's; wandb by default.
RECIPE_DEFAULTS: dict[str, Any] = {
    "learning_rate": 2e-4,
    "lr_scheduler_type": "linear",
    "warmup_steps": 0.1,  # below 1 it is a ratio of the total steps (transformers 5)
    "max_grad_norm": 0.3,
    "report_to": "wandb",
    "logging_steps": 1,
    "save_steps": 50,
    "gradient_checkpointing": False,  # LoRA on a 7B model fits without it; turn it on for long prompts
}
SAMPLING_DEFAULTS: dict[str, Any] = {"temperature": 1.0, "top_p": 0.9, "max_completion_length": 320}


def _with_defaults(cls: type, defaults: dict[str, Any]) -> type:
    """`cls` re-declared with other defaults, at module level (checkpoints pickle the arguments).
    bf16 left unset means "where the hardware has it": trl turns it on unconditionally, which fails
    on a CPU; the same recipe must parse (and run) on both."""
    own = {f.name: f for f in dataclasses.fields(cls)}

    def __post_init__(self):
        if self.bf16 is None and not self.fp16 and not _has_bf16_device():
            self.bf16 = False
        cls.__post_init__(self)

    name = f"{cls.__name__.removesuffix('Config')}Args"
    derived = dataclasses.make_dataclass(
        name,
        [(k, own[k].type, field(default=v, metadata=own[k].metadata)) for k, v in defaults.items()],
        bases=(cls,),
        namespace={"__post_init__": __post_init__},
    )
    derived.__module__, derived.__qualname__ = __name__, name
    return derived


GRPOArgs = _with_defaults(GRPOConfig, {**RECIPE_DEFAULTS, **SAMPLING_DEFAULTS})
RLOOArgs = _with_defaults(RLOOConfig, {**RECIPE_DEFAULTS, **SAMPLING_DEFAULTS})
# ReST's SFT step: ViUniT trains one epoch per iteration with a per-device batch of 2.
SFTArgs = _with_defaults(SFTConfig, {**RECIPE_DEFAULTS, "num_train_epochs": 1.0, "per_device_train_batch_size": 2})
TRAINER_ARGS: dict[str, type] = {"grpo": GRPOArgs, "rloo": RLOOArgs, "rest": SFTArgs}


def _has_bf16_device() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


# Trainer fields that `__post_init__` derives from others; writing them back would over-determine.
DERIVED = frozenset({"generation_batch_size"})

SECTIONS = {
    "policy": PolicyArgs,
    "data": DataArgs,
    "prompt": PromptArgs,
    "executor": ExecutorArgs,
    "rewards": RewardArgs,
    "run": RunArgs,
    "rest": RestArgs,
}


@dataclass
class RLConfig:
    policy: PolicyArgs
    data: DataArgs
    prompt: PromptArgs
    executor: ExecutorArgs
    rewards: RewardArgs
    run: RunArgs
    rest: RestArgs
    training: Any  # GRPOArgs | RLOOArgs | SFTArgs

    @property
    def algorithm(self) -> str:
        return self.run.algorithm

    def to_flat(self) -> dict[str, Any]:
        """The resolved recipe: one flat mapping that `--config` reads back."""
        out: dict[str, Any] = {}
        for name in SECTIONS:
            out.update(dataclasses.asdict(getattr(self, name)))
        training = self.training.to_dict()
        init = {f.name for f in dataclasses.fields(self.training) if f.init}
        out.update({k: v for k, v in training.items() if k in init and k not in DERIVED})
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


def _peek_algorithm(argv: list[str]) -> str:
    algorithm = None
    for i, tok in enumerate(argv):
        if tok == "--algorithm" and i + 1 < len(argv):
            algorithm = argv[i + 1]
        elif tok.startswith("--algorithm="):
            algorithm = tok.split("=", 1)[1]
    if algorithm is None and "--config" in argv:
        path = argv[argv.index("--config") + 1]
        if not Path(path).is_file():
            raise ConfigError(f"config file {path} does not exist")
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
        algorithm = data.get("algorithm") if isinstance(data, dict) else None
    algorithm = algorithm or "grpo"
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm: {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    return algorithm


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


def parse_rl_config(argv: list[str] | None = None) -> RLConfig:
    """Parse `--config recipe.yaml [--key value ...]` into an `RLConfig` (no files are touched
    beyond the recipe; `train.rl.validate` checks what the values name)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    algorithm = _peek_algorithm(argv)
    types = [*SECTIONS.values(), TRAINER_ARGS[algorithm]]
    parsed = parse_config(types, argv)
    sections = dict(zip([*SECTIONS, "training"], parsed[: len(types)], strict=True))
    cfg = RLConfig(**sections)
    cfg.rewards.rewards = structured(cfg.rewards.rewards, "rewards", list) or ["correctness"]
    cfg.rewards.reward_penalties = structured(cfg.rewards.reward_penalties, "reward_penalties", dict)
    cfg.data.dataset_options = structured(cfg.data.dataset_options, "dataset_options", dict) or {}
    cfg.executor.tool_overrides = structured(cfg.executor.tool_overrides, "tool_overrides", dict) or {}
    cfg.rest.rest_vllm_kwargs = structured(cfg.rest.rest_vllm_kwargs, "rest_vllm_kwargs", dict) or {}
    if cfg.training.output_dir is None:
        raise ConfigError("output_dir: required (the run folder: checkpoints, adapter, rollouts, manifest)")
    return cfg
