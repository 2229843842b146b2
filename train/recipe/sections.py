"""The sections of the RL recipe: the policy, the data, the prompt, the executor, the rewards, the run
and the ReST loop. Every key of a flat recipe belongs to exactly one section or to the trainer's
arguments (`train.recipe.trainer_args`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from train.prompts import PromptConfig
from train.recipe.parsing import ConfigError
from train.sampling.generator import PAPER_SAMPLING

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
    load_in_8bit: bool = field(default=False, metadata={"help": "8-bit base through bitsandbytes"})
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


def _prefixed(cls: type, prefix: str, name: str, doc: str, defaults: dict[str, object]) -> type:
    """`cls`'s fields as flat recipe keys (`prefix` + field name), with its defaults unless given."""
    own = [
        (prefix + f.name, f.type, field(default=defaults.get(f.name, f.default)))
        for f in dataclasses.fields(cls)
        if f.init
    ]
    made = dataclasses.make_dataclass(name, own, namespace={"__doc__": doc})
    made.__module__ = __name__
    return made


PromptArgs = _prefixed(
    PromptConfig,
    "prompt_",
    "PromptArgs",
    "`train.prompts.PromptConfig`'s fields, prefixed; `prompt_task` None takes the examples' task.",
    {"task": None},
)


@dataclass
class ExecutorArgs:
    tool_stack: str = field(default="configs/tools/shapes.yaml", metadata={"help": "configs/tools/*.yaml"})
    tool_overrides: str | None = field(default=None, metadata={"help": "backend settings replacing the stack's"})
    executor_slots: int | None = field(default=None, metadata={"help": "sandboxes in parallel (None: cores)"})
    executor_timeout_s: float = 5.0
    executor_sandbox: str = field(default="full", metadata={"help": "full | none (debugging only)"})
    executor_max_rpcs: int = 200
    tool_service: str | None = field(
        default=None,
        metadata={"help": "Ray address of the stack deployed by `python -m executor.serve` (auto: this node)"},
    )


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


KEEP_RULES = ("above", "at_least")
REST_GENERATORS = ("hf", "vllm")


@dataclass
class RestArgs:
    """The ReST loop (ViUniT/ViReP; docs/references.md). Its SFT step takes the recipe's trainer
    arguments (`SFTArgs`) as they are; sampling is `rest_temperature`, `rest_top_p`,
    `rest_max_new_tokens`, seeded with the trainer's `seed` plus the iteration.

    rest_keep_rule: "above" keeps total > rest_keep_threshold; "at_least" keeps total >= it.
    rest_max_kept_per_query: at most this many distinct programs per question (None: no cap).
    rest_restart_from_base: train each iteration from the initial adapter instead of the previous one.
    """

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
    rest_temperature: float = PAPER_SAMPLING.temperature
    rest_top_p: float = PAPER_SAMPLING.top_p
    rest_max_new_tokens: int = PAPER_SAMPLING.max_new_tokens

    def __post_init__(self) -> None:
        for name in ("rest_iterations", "rest_samples_per_query", "rest_generation_batch_size", "rest_max_new_tokens"):
            _positive_int(name, getattr(self, name))
        if self.rest_max_kept_per_query is not None:
            _positive_int("rest_max_kept_per_query", self.rest_max_kept_per_query)
        if self.rest_keep_rule not in KEEP_RULES:
            raise ConfigError(f"rest_keep_rule: {self.rest_keep_rule!r} is not one of {', '.join(KEEP_RULES)}")
        if self.rest_generator not in REST_GENERATORS:
            raise ConfigError(f"rest_generator: {self.rest_generator!r} is not one of {', '.join(REST_GENERATORS)}")
        if not math.isfinite(self.rest_keep_threshold):
            raise ConfigError(f"rest_keep_threshold: must be finite, got {self.rest_keep_threshold!r}")

    def keeps(self, total: float | None) -> bool:
        if total is None:  # infra_error: masked, never a training target
            return False
        return (
            total > self.rest_keep_threshold if self.rest_keep_rule == "above" else total >= self.rest_keep_threshold
        )


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}: must be a positive integer, got {value!r}")
