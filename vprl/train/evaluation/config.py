"""The evaluation's settings (`EvalConfig`: YAML keys or `--key value`). Keys that hold lists or
mappings are kept as text, whichever form they came in; `vprl.train.evaluation.plan` checks them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from vprl.data.loaders import DATASETS
from vprl.executor.api.spec import VARIANTS
from vprl.train.evaluation.modes import FEEDBACK, MODES
from vprl.train.prompts.prompt_config import LAYOUTS

SHAPES_TASKS = ("train", "val", "heldout", "winoground", "sugarcrepe", "refcoco")


# Keys that hold lists or mappings: real YAML lists and mappings in a config file; comma text
# (`a,b`, `name=value,...`) or JSON on the command line. `EvalConfig` keeps them as that text.
LIST_KEYS = ("adapters", "datasets", "modes", "seeds", "seen_split")
PAIR_KEYS = ("data_roots", "splits", "samples")
SETTING_KEYS = ("self_tuning", "unit_tests", "vllm_kwargs")


@dataclass
class EvalConfig:
    """Evaluation settings (YAML keys or `--key value`)."""

    # vprl.train.rl's names for the same settings, so one vocabulary works in both commands' files and flags
    KEY_ALIASES: ClassVar[dict[str, str]] = {
        "model_name_or_path": "policy",
        "tool_stack": "tools",
        "prompt_variant": "variant",
        "prompt_layout": "layout",
        "prompt_ice_file": "ice_file",
        "prompt_max_ices": "max_ices",
        "executor_slots": "slots",
        "executor_timeout_s": "timeout_s",
        "executor_sandbox": "sandbox",
    }

    policy: str = field(default="", metadata={"help": "base model path (local dir or hub id)"})
    adapters: str = field(default="", metadata={"help": "list of adapter folders, each optionally label=path"})
    include_base: bool = field(default=True, metadata={"help": "also evaluate the base model without adapter"})
    base_label: str = field(default="base", metadata={"help": "name of the base policy in reports"})
    datasets: str = field(
        default="shapes:val,shapes:heldout,shapes:winoground,shapes:sugarcrepe,shapes:refcoco",
        metadata={"help": f"list of shapes:<{'|'.join(SHAPES_TASKS)}> and {', '.join(DATASETS)}"},
    )
    shapes_root: str = field(
        default="", metadata={"help": "shapes world folder (python -m vprl.data.shapes writes one)"}
    )
    data_roots: str = field(default="", metadata={"help": "mapping dataset name -> root folder, for real datasets"})
    splits: str = field(default="", metadata={"help": "mapping dataset name -> split, overriding the default"})
    samples: str = field(
        default="", metadata={"help": "mapping dataset name -> the papers' sampling recipe (gqa: gqa_eval, ...)"}
    )
    limit: int = field(default=0, metadata={"help": "at most this many examples per dataset (0 = all)"})
    seen_from: str = field(
        default="", metadata={"help": "the training examples (a shapes world or a JSONL): their queries are 'seen'"}
    )
    seen_split: str = field(
        default="", metadata={"help": "list of datasets reported as <name>-unseen and <name>-seen (needs seen_from)"}
    )
    modes: str = field(default="single", metadata={"help": f"list of inference modes: {', '.join(MODES)}"})
    n_programs: int = field(default=8, metadata={"help": "programs sampled per question (majority, selection)"})
    iterations: int = field(default=2, metadata={"help": "regeneration rounds (reprompt_tests, self_debug)"})
    feedback: str = field(default="error", metadata={"help": f"self_debug: {' or '.join(FEEDBACK)}"})
    refuse_below: float | None = field(default=None, metadata={"help": "unit_test_select: refuse below this score"})
    pass_threshold: float = field(default=1.0, metadata={"help": "reprompt_tests: re-prompt below this score"})
    fallback: bool = field(default=False, metadata={"help": "also report numbers with the end-to-end fallback"})
    fallback_below: float | None = field(
        default=None,
        metadata={"help": "the fallback also answers refused programs and those scoring below this on unit tests"},
    )
    seeds: str = field(default="0", metadata={"help": "list of sampling seeds; every dataset is answered per seed"})
    tools: str = field(default="shapes", metadata={"help": "tool stack YAML"})
    self_tuning: str = field(default="", metadata={"help": "mapping of tool-stack overrides for self-tuning retries"})
    unit_tests: str = field(
        default="", metadata={"help": "mapping of unit-test reward settings for the test modes ({} for defaults)"}
    )
    variant: str = field(default="vipergpt", metadata={"help": f"API variant: {' | '.join(VARIANTS)}"})
    layout: str = field(
        default="stanic", metadata={"help": f"prompt layout: {' | '.join(LAYOUTS)} (bare: tiny policies)"}
    )
    ice_file: str | None = field(default=None, metadata={"help": "JSONL of in-context examples (none: zero-shot)"})
    max_ices: int | None = field(default=None, metadata={"help": "use the file's first N examples (none: all)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the sampling modes"})
    top_p: float = field(default=0.9, metadata={"help": "nucleus sampling mass"})
    max_new_tokens: int = field(default=320, metadata={"help": "program length limit in tokens"})
    batch_size: int = field(default=32, metadata={"help": "prompts per generation batch (transformers)"})
    chunk: int = field(default=64, metadata={"help": "questions handed to a mode at once: the progress bar's step"})
    threads: int = field(default=0, metadata={"help": "torch CPU threads for generation (0: torch's default)"})
    torch_dtype: str = field(default="auto", metadata={"help": "auto (bf16 on a GPU, fp32 on CPU) | float32 | ..."})
    load_in_4bit: bool = field(default=False, metadata={"help": "4-bit base through bitsandbytes"})
    load_in_8bit: bool = field(default=False, metadata={"help": "8-bit base through bitsandbytes"})
    framing: str = field(default="auto", metadata={"help": "prompt framing: auto | plain | chat"})
    generator: str = field(default="auto", metadata={"help": "auto (vLLM on a GPU when installed) | hf | vllm"})
    vllm_gpu_memory_utilization: float = field(
        default=0.5,
        metadata={
            "help": "share of GPU 0 vLLM's engine reserves for the policy; the tools load into the rest "
            "(vLLM's own 0.9 leaves them nothing)"
        },
    )
    vllm_kwargs: str = field(
        default="", metadata={"help": "mapping of other vllm.LLM arguments (max_model_len, enforce_eager, ...)"}
    )
    sandbox: str = field(
        default="auto",
        metadata={
            "help": "auto (full where namespaces work, else restricted) | full | restricted | none (debugging only)"
        },
    )
    slots: int = field(default=2, metadata={"help": "programs run in parallel"})
    timeout_s: float = field(
        default=5.0,
        metadata={
            "help": "seconds of a program's own time (tool waits excluded; the runner's wall bound covers them)"
        },
    )
    out: str = field(default="runs/eval", metadata={"help": "folder of the reports, plots and predictions"})

    def __post_init__(self) -> None:
        for key in LIST_KEYS:
            setattr(self, key, _list_text(getattr(self, key), key))
        for key in PAIR_KEYS:
            setattr(self, key, _pairs_text(getattr(self, key), key))
        for key in SETTING_KEYS:
            setattr(self, key, _settings_text(getattr(self, key), key))


def _list_text(value: Any, key: str) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v).strip() for v in value)
    if isinstance(value, str | int) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"{key}: expected a list, got {type(value).__name__} {value!r:.80}")


def _pairs_text(value: Any, key: str) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, str):
        return value
    raise ValueError(f"{key}: expected a mapping of dataset names, got {type(value).__name__} {value!r:.80}")


def _settings_text(value: Any, key: str) -> str:
    """A settings mapping as JSON text ("" when none): from YAML, or JSON/YAML text on the command line."""
    from vprl.train.recipe.parsing import structured

    if value == "":
        return ""
    mapping = structured(value, key, dict)
    return "" if mapping is None else json.dumps(mapping)
