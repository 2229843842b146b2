"""The ranges numeric options and config keys may take, checked before any work starts.

NaN and infinity are never a setting. A negative number is refused unless the key's range allows it
(or, for library keys we do not list, it is the key's own default, like transformers' `max_steps: -1`
for "no limit"). Where zero means nothing (a learning rate, a batch size, a timeout) the range says
so. Shared by the argparse commands (`vprl.data.cli.CommandParser`) and the config-file commands
(`vprl.train.recipe.parsing`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Range:
    low: float | None = 0.0
    low_open: bool = False
    high: float | None = None
    high_open: bool = False

    def problem(self, value: float) -> str | None:
        """Why `value` is outside the range, or None."""
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number, got {value}"
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return f"must be {'>' if self.low_open else '>='} {self.low:g}{self._high_text()}, got {value:g}"
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            return f"must be {'<' if self.high_open else '<='} {self.high:g}{self._low_text()}, got {value:g}"
        return None

    def _high_text(self) -> str:
        return "" if self.high is None else f" and {'<' if self.high_open else '<='} {self.high:g}"

    def _low_text(self) -> str:
        return "" if self.low is None else f" and {'>' if self.low_open else '>='} {self.low:g}"


NON_NEGATIVE = Range(0.0)
POSITIVE = Range(0.0, low_open=True)
AT_LEAST_ONE = Range(1.0)
FRACTION = Range(0.0, high=1.0)  # [0, 1]
SHARE = Range(0.0, low_open=True, high=1.0)  # (0, 1]
ANY = Range(None)

# Config keys of every command whose range is narrower than "not negative". Keys not listed get the
# default rule (finite, and not negative unless it is the key's default).
KEY_RANGES: dict[str, Range] = {
    # optimisation
    "learning_rate": POSITIVE,
    "num_train_epochs": POSITIVE,
    "per_device_train_batch_size": AT_LEAST_ONE,
    "per_device_eval_batch_size": AT_LEAST_ONE,
    "gradient_accumulation_steps": AT_LEAST_ONE,
    "warmup_ratio": FRACTION,
    "logging_steps": POSITIVE,
    "save_steps": POSITIVE,
    "eval_steps": POSITIVE,
    "adam_beta1": Range(0.0, high=1.0, high_open=True),
    "adam_beta2": Range(0.0, high=1.0, high_open=True),
    "adam_epsilon": POSITIVE,
    # sampling and the RL objective
    "temperature": POSITIVE,
    "top_p": SHARE,
    "min_p": FRACTION,
    "repetition_penalty": POSITIVE,
    "num_generations": Range(2.0),  # a group of one has no baseline
    "num_iterations": AT_LEAST_ONE,
    "steps_per_generation": AT_LEAST_ONE,
    "max_completion_length": AT_LEAST_ONE,
    "max_new_tokens": AT_LEAST_ONE,
    "max_prompt_length": AT_LEAST_ONE,
    "epsilon": POSITIVE,
    "epsilon_high": POSITIVE,
    "vllm_gpu_memory_utilization": SHARE,
    "gpu_memory_utilization": SHARE,
    # policy
    "lora_r": AT_LEAST_ONE,
    "lora_alpha": POSITIVE,
    "lora_dropout": Range(0.0, high=1.0, high_open=True),
    # executor and data
    "executor_slots": AT_LEAST_ONE,
    "executor_timeout_s": POSITIVE,
    "timeout_s": POSITIVE,
    "slots": AT_LEAST_ONE,
    "dataset_limit": AT_LEAST_ONE,
    "samples": AT_LEAST_ONE,
    # evaluation and ACEs
    "batch_size": AT_LEAST_ONE,
    "chunk": AT_LEAST_ONE,
    "num_tests": AT_LEAST_ONE,
    "k": AT_LEAST_ONE,
    "n": AT_LEAST_ONE,
    "trials": AT_LEAST_ONE,
    "refuse_below": FRACTION,
    "fallback_below": FRACTION,
    "min_score": ANY,  # a reward threshold: rewards may be negative
    "rest_keep_threshold": ANY,  # likewise
}


def key_problem(key: str, value: Any, default: Any = None) -> str | None:
    """Why a config key's numeric value is out of range (None: fine, or not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    known = KEY_RANGES.get(key)
    if known is not None:
        return known.problem(value)
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if value < 0 and value != default:
        return f"must be >= 0, got {value:g}"
    return None
