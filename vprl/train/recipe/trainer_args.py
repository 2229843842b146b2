"""The trainer's arguments of the RL recipe: trl's `GRPOConfig`, `RLOOConfig` and (for `rest`)
`SFTConfig`, re-declared with the ViUniT recipe's defaults."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any

from trl import GRPOConfig, RLOOConfig, SFTConfig

from vprl.train.sampling.generator import PAPER_SAMPLING

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
    # Off unless asked (LoRA on a 7B model fits without it; turn it on for long prompts). transformers
    # 5.23 renamed it `activation_checkpointing` and warns on the old name; a recipe may use either, on
    # every transformers the install pins allow (`_CHECKPOINTING`).
    "activation_checkpointing": None,
    "gradient_checkpointing": None,
}
SAMPLING_DEFAULTS: dict[str, Any] = {
    "temperature": PAPER_SAMPLING.temperature,
    "top_p": PAPER_SAMPLING.top_p,
    "max_completion_length": PAPER_SAMPLING.max_new_tokens,
}


# The recipe's names for activation checkpointing, declared here where transformers lacks them: the
# vllm extra pins transformers below 5.18 (vLLM 0.31 requires it), which knows only the old names.
_CHECKPOINTING: dict[str, tuple[Any, str]] = {
    "activation_checkpointing": (
        bool | None,
        "Recompute activations in the backward pass to save memory (`gradient_checkpointing` before transformers 5.23).",
    ),
    "activation_checkpointing_kwargs": (
        dict[str, Any] | str | None,
        "Keyword arguments of `gradient_checkpointing_enable()` (`gradient_checkpointing_kwargs` before 5.23).",
    ),
}


def _with_defaults(cls: type, defaults: dict[str, Any]) -> type:
    """`cls` re-declared with other defaults, at module level (checkpoints pickle the arguments).
    bf16 left unset means "where the hardware has it": trl turns it on unconditionally, which fails
    on a CPU; the same recipe must parse (and run) on both."""
    own = {f.name: f for f in dataclasses.fields(cls)}
    # Before 5.23 the new names are ours: the recipe keeps them and transformers gets the old ones.
    declared = {k: v for k, v in _CHECKPOINTING.items() if k not in own}
    if declared:
        defaults = {**defaults, "activation_checkpointing_kwargs": None}

    def __post_init__(self):
        if self.bf16 is None and not self.fp16 and not _has_bf16_device():
            self.bf16 = False
        if self.activation_checkpointing is None:
            self.activation_checkpointing = bool(self.gradient_checkpointing)
        if declared:
            self.gradient_checkpointing = self.activation_checkpointing
            if self.activation_checkpointing_kwargs is not None:
                self.gradient_checkpointing_kwargs = self.activation_checkpointing_kwargs
            cls.__post_init__(self)
            self.activation_checkpointing_kwargs = self.gradient_checkpointing_kwargs
            return
        self.gradient_checkpointing = None  # transformers mirrors the new name into it
        cls.__post_init__(self)

    def declare(key: str, value: Any) -> tuple[str, Any, Any]:
        if key in own:
            return key, own[key].type, field(default=value, metadata=own[key].metadata)
        return key, declared[key][0], field(default=value, metadata={"help": declared[key][1]})

    name = f"{cls.__name__.removesuffix('Config')}Args"
    derived = dataclasses.make_dataclass(
        name,
        [declare(k, v) for k, v in defaults.items()],
        bases=(cls,),
        namespace={"__post_init__": __post_init__},
    )
    derived.__module__, derived.__qualname__ = __name__, name
    return derived


# The online algorithms: the same KL weight for both, so switching `algorithm` compares the estimators
# and nothing else (trl's own defaults differ: GRPO 0, RLOO 0.05); and no dropout, so the passes that
# compute old, reference and new log-probabilities of one batch agree (with LoRA dropout 0.05 they
# differ by noise, and vLLM's importance-sampling correction would drop sequences for it).
ONLINE_DEFAULTS: dict[str, Any] = {"beta": 0.0, "disable_dropout": True}
GRPOArgs = _with_defaults(GRPOConfig, {**RECIPE_DEFAULTS, **SAMPLING_DEFAULTS, **ONLINE_DEFAULTS})
RLOOArgs = _with_defaults(RLOOConfig, {**RECIPE_DEFAULTS, **SAMPLING_DEFAULTS, **ONLINE_DEFAULTS})
# ReST's SFT step: ViUniT trains one epoch per iteration with a per-device batch of 2.
SFTArgs = _with_defaults(SFTConfig, {**RECIPE_DEFAULTS, "num_train_epochs": 1.0, "per_device_train_batch_size": 2})
TRAINER_ARGS: dict[str, type] = {"grpo": GRPOArgs, "rloo": RLOOArgs, "rest": SFTArgs}


def _has_bf16_device() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def checkpointing(enabled: bool) -> dict[str, bool]:
    """The keyword that switches activation checkpointing for trl's own configs (`SFTConfig(...,
    **checkpointing(False))`): the new name where this transformers has it, else the old one."""
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": enabled}
