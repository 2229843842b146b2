"""The sections of the RL recipe: the policy, the data, the prompt, the executor, the rewards, the run
and the ReST loop. Every key of a flat recipe belongs to exactly one section or to the trainer's
arguments (`vprl.train.recipe.trainer_args`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from vprl.executor.settings import ExecutorArgs  # noqa: F401  (the recipe's executor section, shared)
from vprl.rewards.feedback import FeedbackConfig
from vprl.train.prompts import PromptConfig
from vprl.train.prompts.conversation import episode_tokens
from vprl.train.recipe.parsing import ConfigError
from vprl.train.repair.turns import RepairConfig
from vprl.train.sampling.generator import PAPER_SAMPLING, SamplingSettings, policy_sampling

DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


@dataclass
class ModelArgs:
    """The policy model and how it is loaded: what every command that samples from a policy takes."""

    model_name_or_path: str | None = field(default=None, metadata={"help": "policy model folder or hub id"})
    framing: str = field(default="auto", metadata={"help": "prompt framing: auto | plain | chat"})
    torch_dtype: str = field(default="auto", metadata={"help": "auto | float32 | bfloat16 | float16"})
    load_in_4bit: bool = field(default=False, metadata={"help": "QLoRA: 4-bit base through bitsandbytes"})
    load_in_8bit: bool = field(default=False, metadata={"help": "8-bit base through bitsandbytes"})
    bnb_4bit_quant_type: str = field(default="nf4", metadata={"help": "4-bit data type: nf4 | fp4"})
    bnb_4bit_compute_dtype: str = field(
        default="bfloat16", metadata={"help": "dtype of the 4-bit matmuls: bfloat16 | float16 | float32"}
    )
    bnb_4bit_use_double_quant: bool = field(default=True, metadata={"help": "quantize the quantization constants too"})


@dataclass
class PolicyArgs(ModelArgs):
    """The policy: a causal code LM (local folder or hub id) with a LoRA adapter."""

    policy_name: str | None = field(default=None, metadata={"help": "name in manifests and rollouts"})
    adapter_path: str | None = field(default=None, metadata={"help": "start from this LoRA adapter"})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scale numerator (the update is scaled by alpha / r)"})
    lora_dropout: float = field(default=0.05, metadata={"help": "dropout on the LoRA input"})
    lora_target_modules: list[str] = field(
        default_factory=lambda: list(DEFAULT_LORA_TARGETS),
        metadata={
            "help": "module names that get an adapter, e.g. q_proj k_proj v_proj o_proj; all-linear: every linear"
        },
    )


@dataclass
class SamplingArgs:
    """How programs are sampled, under trl's `GRPOConfig` names: the evaluation, the bootstrap's
    evaluation and ReST take these keys; GRPO and RLOO recipes give the same keys to trl itself."""

    num_generations: int = field(default=8, metadata={"help": "programs sampled per question"})
    temperature: float = field(default=PAPER_SAMPLING.temperature, metadata={"help": "sampling temperature"})
    top_p: float = field(default=PAPER_SAMPLING.top_p, metadata={"help": "nucleus sampling mass"})
    max_completion_length: int = field(
        default=PAPER_SAMPLING.max_new_tokens, metadata={"help": "program length limit in tokens"}
    )

    def __post_init__(self) -> None:
        _positive_int("num_generations", self.num_generations)
        _positive_int("max_completion_length", self.max_completion_length)
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ConfigError(f"temperature: must be a positive number, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p: must be in (0, 1], got {self.top_p!r}")

    def settings(self, **more: Any) -> SamplingSettings:
        """The samplers' settings: the papers' stops, these values, `more` (a seed, ...)."""
        return policy_sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=self.max_completion_length,
            n=self.num_generations,
            **more,
        )

    @classmethod
    def of_trainer(cls, training: Any) -> SamplingArgs:
        """The same four keys as trl's GRPO and RLOO arguments hold them."""
        return cls(**{f.name: getattr(training, f.name) for f in dataclasses.fields(cls)})


@dataclass
class DataArgs:
    """The training examples: one dataset (the `dataset_*` keys) or a mixture of several
    (`dataset_mixture`, whose entries take those keys without the prefix; `dataset_root` is then the
    folder their roots are relative to)."""

    dataset: str = field(default="shapes", metadata={"help": "'shapes' (the shapes world) or a loader name"})
    dataset_root: str | None = field(default=None, metadata={"help": "dataset folder (shapes: world root)"})
    dataset_split: str | None = field(default=None, metadata={"help": "loader split (None: its default)"})
    dataset_tasks: list[str] = field(default_factory=lambda: ["train"], metadata={"help": "shapes-world tasks"})
    dataset_sample: str | None = field(
        default=None, metadata={"help": "papers' sampling recipe: gqa_train | gqa_eval | okvqa | vqav2"}
    )
    dataset_sample_seed: int = field(default=0, metadata={"help": "seed of the papers' sampling recipe"})
    dataset_sample_cache: str | None = field(
        default="auto",
        metadata={
            "help": "folder keeping drawn samples, so one process parses the dataset and the others read the "
            "sample (auto: $XDG_CACHE_HOME/vprl/samples or ~/.cache/vprl/samples; null: every process parses)"
        },
    )
    dataset_limit: int | None = field(default=None, metadata={"help": "keep the first N examples"})
    dataset_options: str | None = field(default=None, metadata={"help": "loader keyword options (mapping)"})
    dataset_labels: bool = field(
        default=True,
        metadata={"help": "false: withhold the answers at load time (label-free rewards only, e.g. unit_tests)"},
    )
    dataset_mixture: str | None = field(
        default=None,
        metadata={
            "help": "several datasets with weights (mapping {seed, datasets: [{dataset, weight, tasks, labels, "
            "rewards, prompt, ...}]}; vprl.train.recipe.mixture), in place of the dataset_* keys"
        },
    )


def _prefixed(cls: type, prefix: str, name: str, doc: str, defaults: dict[str, object]) -> type:
    """`cls`'s fields as flat recipe keys (`prefix` + field name), with its defaults unless given."""
    own = [
        (prefix + f.name, f.type, field(default=defaults.get(f.name, f.default), metadata=f.metadata))
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
    "`vprl.train.prompts.PromptConfig`'s fields, prefixed; `prompt_task` None takes the examples' task.",
    {"task": None},
)


@dataclass
class RewardArgs:
    rewards: str | None = field(
        default=None,
        metadata={"help": "reward names, or mappings {name, weight, settings}; none given: correctness"},
    )
    reward_penalties: str | None = field(
        default=None, metadata={"help": "mapping of program status (syntax_error, runtime_error, ...) to its total"}
    )
    filter_zero_variance: bool = field(
        default=False, metadata={"help": "drop groups whose rewards are all equal from the loss"}
    )
    stop_at_program_end: bool = field(
        default=True, metadata={"help": "cut completions at the first stop sequence after the function"}
    )
    overlap_execution: bool = field(
        default=True, metadata={"help": "run the programs while trl computes log-probabilities, not after"}
    )
    rollout_traces: bool = field(
        default=True,
        metadata={
            "help": "keep tool-call traces and unit-test outcomes in rollouts.jsonl (the run viewer's evidence)"
        },
    )
    program_table_steps: int = field(default=50, metadata={"help": "wandb table of programs every N steps"})


@dataclass
class RepairArgs:
    """Learned repair (docs/repair.md): episodes of up to `repair_max_turns` programs, each written
    after the feedback on the one before; 1 trains one program per question."""

    repair_max_turns: int = field(default=1, metadata={"help": "programs per episode at most (1: no repair)"})
    repair_stop_when: str = field(
        default="ran",
        metadata={"help": "ran | passed: when an episode ends (passed: repair_check reaches the threshold)"},
    )
    repair_check: str | None = field(
        default=None, metadata={"help": "the reward whose value decides a pass (correctness, unit_tests, ...)"}
    )
    repair_pass_threshold: float = field(default=1.0, metadata={"help": "repair_check's value that passes"})
    repair_feedback: str | None = field(
        default=None,
        metadata={
            "help": "what feedback shows, among error, trace, unit_tests, verdict, unasked (default: the first three)"
        },
    )
    repair_turn_cost: float = field(default=0.0, metadata={"help": "subtracted from the reward per extra turn"})
    repair_repeat_cost: float = field(
        default=0.0,
        metadata={"help": "subtracted from the reward per later program that repeats an earlier one of its episode"},
    )
    repair_branches: int = field(
        default=1,
        metadata={
            "help": "rows of a group that share one first program, each writing its own later programs from "
            "it and its feedback (turn-level groups; divides num_generations; grpo and rloo)"
        },
    )

    repair_kl_turns: str = field(
        default="all",
        metadata={
            "help": "all | later: the KL to the reference (beta) on every program token, or only on the programs "
            "written after feedback, so RL moves the first program freely and keeps the repairs near the "
            "reference's (grpo, beta > 0)"
        },
    )
    repair_guide_weight: float = field(
        default=0.0,
        metadata={
            "help": "weight of an SFT term beside the RL loss: each wrong first program that got feedback, followed by "
            "a right final program of its question from the same batch (grpo; 0: off)"
        },
    )
    repair_replay_weight: float = field(
        default=0.0,
        metadata={
            "help": "weight of an SFT term beside the RL loss on replayed repair pairs (repair_replay_pairs: the "
            "bootstrap's own wrong program, feedback and gold program), PPO-ptx's anchor against the fading of "
            "the second turn's reading (grpo; 0: off)"
        },
    )
    repair_replay_pairs: str | None = field(
        default=None,
        metadata={
            "help": "JSONL of repair pairs to replay (the bootstrap writes repair_pairs.jsonl beside its policy); "
            "none given: <model_name_or_path>/repair_pairs.jsonl"
        },
    )
    repair_replay_rows: int = field(
        default=8, metadata={"help": "rows of each generation batch that carry a replayed pair"}
    )
    repair_turn_advantage: float = field(
        default=0.0,
        metadata={
            "help": "weight of the later programs' own advantage (a row's less its block's mean: the rows sharing "
            "a first program), added on their tokens to the episode's (GiGPO's step-level groups; grpo, "
            "repair_branches > 1; 0: off)"
        },
    )

    repair_first_credit: str = field(
        default="episode",
        metadata={
            "help": "episode | own | both | none: what the first program's tokens carry: the episode's advantage, "
            "the group-relative advantage of the first program's own reward (trained as a one-turn run trains it), "
            "their sum (MT-GRPO's turn-level credit), or nothing (only the later programs are trained); grpo"
        },
    )
    repair_first_weight: float = field(
        default=1.0,
        metadata={
            "help": "multiplies what the first program's tokens carry (repair_first_credit's advantage): below 1 "
            "the first program moves slower than the later ones, whose reading of their feedback fades as the "
            "first program trains (docs/repair.md); 1: off; grpo"
        },
    )
    repair_later_credit: str = field(
        default="episode",
        metadata={
            "help": "episode | fresh: what the later programs' tokens carry: the episode's advantage, or the "
            "episode's reward less the mean reward of its group's other first programs (what a fresh sample of "
            "the question earns: paid for repairing better than resampling); grpo"
        },
    )

    def __post_init__(self) -> None:
        if isinstance(self.repair_feedback, str):
            self.repair_feedback = [p.strip() for p in self.repair_feedback.replace(",", " ").split() if p.strip()]

    @property
    def enabled(self) -> bool:
        return self.repair_max_turns > 1

    def completion_tokens(self, max_completion_length: int) -> int:
        """What one sampled sequence holds at most: a program, or a whole episode with repair."""
        return episode_tokens(self.repair_max_turns, max_completion_length)

    def config(self) -> RepairConfig:
        """The `RepairConfig` the episode loop takes; a bad value raises ConfigError naming its key."""
        try:
            shown = tuple(self.repair_feedback) if self.repair_feedback else FeedbackConfig.show
            feedback = FeedbackConfig(
                stop_when=self.repair_stop_when,
                check=self.repair_check,
                pass_threshold=self.repair_pass_threshold,
                show=shown,
            )
            return RepairConfig(self.repair_max_turns, self.repair_turn_cost, feedback, self.repair_repeat_cost)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


@dataclass
class RunArgs:
    """global_batch_size: samples per optimizer step over all processes (completions for GRPO/RLOO).
    Set, it decides gradient_accumulation_steps = global_batch_size / (per_device_train_batch_size x
    processes), so a run on N GPUs takes the optimizer steps, and so the learning-rate schedule, of
    the one-GPU run; unset, N processes take 1/N of them with the same schedule settings."""

    algorithm: str = field(default="grpo", metadata={"help": "grpo | rloo | rest"})
    resume: bool = field(default=True, metadata={"help": "resume from the last checkpoint in output_dir"})
    global_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "samples per optimizer step over all processes; derives gradient_accumulation_steps "
            "from the number of processes (none: gradient_accumulation_steps as given)"
        },
    )

    def __post_init__(self) -> None:
        if self.global_batch_size is not None:
            _positive_int("global_batch_size", self.global_batch_size)


def accumulation_for(global_batch_size: int, per_device: int, processes: int) -> int:
    """gradient_accumulation_steps that make `global_batch_size` samples per optimizer step."""
    per_micro_step = per_device * processes
    if global_batch_size % per_micro_step:
        fits = [b for b in range(1, per_device + 1) if global_batch_size % (b * processes) == 0]
        hint = (
            f"per_device_train_batch_size {' or '.join(map(str, fits[-3:]))} divides it"
            if fits
            else f"no per_device_train_batch_size divides it over {processes} processes"
        )
        raise ConfigError(
            f"global_batch_size: {global_batch_size} is not a multiple of per_device_train_batch_size x processes "
            f"= {per_device} x {processes} = {per_micro_step} ({hint})"
        )
    return global_batch_size // per_micro_step


KEEP_RULES = ("above", "at_least")
REST_GENERATORS = ("hf", "vllm")


@dataclass
class RestArgs:
    """The ReST loop (ViUniT/ViReP; docs/references.md). Its SFT step takes the recipe's trainer
    arguments (`SFTArgs`) as they are; sampling is the `SamplingArgs` section (`num_generations`
    programs per question, `temperature`, `top_p`, `max_completion_length`), seeded with the trainer's
    `seed` plus the iteration. Both sections are keys of ReST recipes only.

    rest_keep_rule: "above" keeps total > rest_keep_threshold; "at_least" keeps total >= it.
    rest_max_kept_per_query: at most this many distinct programs per question (None: no cap).
    rest_restart_from_base: train each iteration from the initial adapter instead of the previous one.
    """

    rest_iterations: int = field(default=3, metadata={"help": "sample, filter, fine-tune rounds"})
    rest_keep_threshold: float = field(default=0.0, metadata={"help": "keep programs whose total passes this"})
    rest_keep_rule: str = field(default="above", metadata={"help": "above (>) | at_least (>=)"})
    rest_dedupe: bool = field(default=True, metadata={"help": "keep each distinct program of a question once"})
    rest_max_kept_per_query: int | None = field(
        default=None, metadata={"help": "at most this many kept programs per question (none: no cap)"}
    )
    rest_restart_from_base: bool = field(
        default=False, metadata={"help": "fine-tune each round from the initial adapter, not the previous round's"}
    )
    rest_generator: str = field(default="hf", metadata={"help": "hf (transformers) | vllm (offline engine)"})
    generation_batch_size: int = field(
        default=16, metadata={"help": "prompts x samples per transformers batch (trl's name for the same)"}
    )
    rest_vllm_kwargs: str | None = field(default=None, metadata={"help": "vllm.LLM arguments (mapping)"})

    def __post_init__(self) -> None:
        for name in ("rest_iterations", "generation_batch_size"):
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
