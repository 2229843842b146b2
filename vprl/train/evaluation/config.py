"""The evaluation's settings (`EvalConfig`: YAML keys or `--key value`). Keys that hold lists or
mappings are parsed here into lists and dicts, whichever form they came in; `vprl.train.evaluation.plan`
checks what they name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vprl.data.loaders import DATASETS
from vprl.executor.settings import ExecutorArgs
from vprl.train.evaluation.modes import EVAL_PARTS, FEEDBACK, KEEP, MODES
from vprl.train.recipe.sections import ModelArgs, PromptArgs, SamplingArgs

SHAPES_TASKS = ("train", "val", "heldout", "winoground", "sugarcrepe", "refcoco")


# Keys that hold lists or mappings: real YAML lists and mappings in a config file; comma text
# (`a,b`, `name=value,...`) or JSON on the command line. Declared as text for the argument parser's
# sake; `EvalConfig.__post_init__` leaves them lists, dicts (None for settings not given) and seeds ints.
LIST_KEYS = ("adapters", "datasets", "modes", "seen_split", "show")
PAIR_KEYS = ("data_roots", "splits", "samples")
SETTING_KEYS = ("self_tuning", "unit_tests", "vllm_kwargs")


@dataclass
class EvalConfig(SamplingArgs, ExecutorArgs, PromptArgs, ModelArgs):
    """Evaluation settings (YAML keys or `--key value`). The policy, prompt, executor and sampling
    keys are the RL recipe's sections, under the same names (docs/configs.md); `prompt_task` stays
    unset, each dataset's task decides it."""

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
    iterations: int = field(default=2, metadata={"help": "regeneration rounds (reprompt_tests, self_debug)"})
    feedback: str = field(default="error", metadata={"help": f"self_debug: {' or '.join(FEEDBACK)}"})
    refuse_below: float | None = field(default=None, metadata={"help": "unit_test_select: refuse below this score"})
    pass_threshold: float = field(
        default=1.0, metadata={"help": "reprompt_tests, repair with stop_when passed: re-prompt below this score"}
    )
    # A trained repair policy is best judged at the threshold its episodes ended at in training (the
    # recipe's `repair_pass_threshold`): below it, right programs failing one test are sent back.
    repair_pass_threshold: float | None = field(
        default=None,
        metadata={"help": "repair with stop_when passed: its own threshold (default: pass_threshold)"},
    )
    turns: int = field(default=2, metadata={"help": "repair: programs per question at most"})
    stop_when: str = field(
        default="ran",
        metadata={"help": "repair: ran | passed (the unit tests reach pass_threshold; needs unit_tests)"},
    )
    show: str = field(
        default="error,trace,unit_tests",
        metadata={"help": f"repair: list of what the feedback shows, among {', '.join(EVAL_PARTS)}"},
    )
    keep: str = field(
        default="final", metadata={"help": f"repair: which program answers, {' or '.join(KEEP)} (by unit tests)"}
    )
    later_turns: str = field(
        default="greedy",
        metadata={
            "help": "repair: programs after the first written greedy, or sampled (temperature, top_p) as in training"
        },
    )
    fallback: bool = field(default=False, metadata={"help": "also report numbers with the end-to-end fallback"})
    fallback_below: float | None = field(
        default=None,
        metadata={"help": "the fallback also answers refused programs and those scoring below this on unit tests"},
    )
    seeds: str = field(default="0", metadata={"help": "list of sampling seeds; every dataset is answered per seed"})
    self_tuning: str = field(default="", metadata={"help": "mapping of tool-stack overrides for self-tuning retries"})
    unit_tests: str = field(
        default="", metadata={"help": "mapping of unit-test reward settings for the test modes ({} for defaults)"}
    )
    batch_size: int = field(default=32, metadata={"help": "prompts per generation batch (transformers)"})
    chunk: int = field(default=64, metadata={"help": "questions handed to a mode at once: the progress bar's step"})
    threads: int = field(default=0, metadata={"help": "torch CPU threads for generation (0: torch's default)"})
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
    out: str = field(default="runs/eval", metadata={"help": "folder of the reports, plots and predictions"})

    def __post_init__(self) -> None:
        ExecutorArgs.__post_init__(self)
        SamplingArgs.__post_init__(self)
        if self.prompt_task is not None:
            raise ValueError(f"prompt_task: each dataset's task decides it in an evaluation, got {self.prompt_task!r}")
        for key in LIST_KEYS:
            setattr(self, key, _as_list(getattr(self, key), key))
        for key in PAIR_KEYS:
            setattr(self, key, _as_pairs(getattr(self, key), key))
        for key in SETTING_KEYS:
            setattr(self, key, _as_settings(getattr(self, key), key))
        self.seeds = _as_seeds(self.seeds)


def _as_list(value: Any, key: str) -> list[str]:
    if isinstance(value, list | tuple):
        items = [str(v).strip() for v in value]
    elif isinstance(value, str | int) and not isinstance(value, bool):
        items = [s.strip() for s in str(value).split(",")]
    else:
        raise ValueError(f"{key}: expected a list, got {type(value).__name__} {value!r:.80}")
    return [item for item in items if item]


def _as_pairs(value: Any, key: str) -> dict[str, str]:
    if isinstance(value, dict):
        return {str(k).strip(): str(v).strip() for k, v in value.items()}
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a mapping of dataset names, got {type(value).__name__} {value!r:.80}")
    out = {}
    for item in filter(None, (s.strip() for s in value.split(","))):
        if "=" not in item:
            raise ValueError(f"{key}: {item!r} is not name=value")
        name, text = item.split("=", 1)
        out[name.strip()] = text.strip()
    return out


def _as_settings(value: Any, key: str) -> dict[str, Any] | None:
    """A settings mapping (None when not given; `{}` is "the defaults"): from YAML, or JSON/YAML text
    on the command line."""
    from vprl.train.recipe.parsing import structured

    if value == "" or value is None:
        return None
    return structured(value, key, dict)


def _as_seeds(value: Any) -> list[int]:
    items = _as_list(value, "seeds")
    try:
        seeds = [int(s) for s in items]
    except ValueError:
        raise ValueError(f"seeds: expected a comma list of integers, got {value!r}") from None
    if not seeds:
        raise ValueError("seeds: empty")
    return seeds
