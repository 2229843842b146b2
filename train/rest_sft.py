"""The SFT half of the ReST loop: training sequences built from kept programs, the trl SFTTrainer
step, and saving/loading the LoRA adapter between iterations.

A training sequence is the framed prompt's ids exactly as the generators encode them
(`encode_prompt(frame_prompt(prompt))`: one BOS, the chat frame when the tokenizer has one), then
the program body the model wrote and EOS; the loss covers the body and EOS only.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from executor.program import ENTRY
from train.prompts import encode_prompt, frame_prompt

if TYPE_CHECKING:
    from train.rest import RestConfig

ADAPTER_WEIGHTS = "adapter_model.safetensors"
# SFTConfig fields the loop sets itself; `RestConfig.sft_overrides` may not name them.
LOOP_OWNED = ("output_dir", "num_train_epochs", "completion_only_loss", "max_length", "use_cpu")


def check_sft_overrides(overrides: dict[str, Any]) -> None:
    """Fail before any work when an override is not an `SFTConfig` field or is one the loop owns."""
    from trl import SFTConfig

    valid = sorted(f.name for f in dataclasses.fields(SFTConfig) if f.init)
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        raise ValueError(f"RestConfig.sft_overrides: unknown SFTConfig field(s) {unknown}; valid fields are {valid}")
    owned = sorted(set(LOOP_OWNED) & set(overrides))
    if owned:
        raise ValueError(f"RestConfig.sft_overrides: {owned} are set by the ReST loop itself")


def program_body(program: str) -> str | None:
    """The text after the entry point's `def` line (what the model writes after the prompt's
    signature), without trailing blank lines; None when the program has no entry point first."""
    first, sep, rest = program.partition("\n")
    if not first.startswith(f"def {ENTRY}") or not sep or not rest.strip():
        return None
    return "\n" + rest.rstrip()


def sft_example(tokenizer: Any, prompt: str, program: str, style: str = "auto") -> dict[str, list[int]] | None:
    """`input_ids` = the framed prompt's ids exactly as the generator encodes them, then the body and
    EOS; `completion_mask` marks the body and EOS. None when the program has no body to learn.

    The body's ids come from tokenizing prompt + body together when that keeps the prompt's ids as a
    prefix (the usual case); otherwise (a token merging across the boundary) from the body alone."""
    body = program_body(program)
    if body is None:
        return None
    framed = frame_prompt(prompt, tokenizer, style)
    prompt_ids = encode_prompt(framed, tokenizer)
    full = encode_prompt(framed + body, tokenizer)
    if full[: len(prompt_ids)] == prompt_ids:
        body_ids = full[len(prompt_ids) :]
    else:
        body_ids = list(tokenizer(body, add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is None:
        raise ValueError("the policy's tokenizer has no EOS token: a kept program could not be taught to end")
    body_ids = [*body_ids, tokenizer.eos_token_id]
    return {"input_ids": prompt_ids + body_ids, "completion_mask": [0] * len(prompt_ids) + [1] * len(body_ids)}


def save_adapter(model: Any, path: Path) -> None:
    """peft `save_pretrained` (safetensors) into a temporary folder renamed into place, so a crash
    never leaves a half-written adapter that looks done."""
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(str(tmp), safe_serialization=True)
    if not (tmp / ADAPTER_WEIGHTS).is_file():
        raise RuntimeError(f"save_pretrained wrote no {ADAPTER_WEIGHTS} in {tmp}: is the policy a peft model?")
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def load_adapter(model: Any, path: Path) -> None:
    """Load saved LoRA weights into the live peft model (the same modules, new values)."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    if not (path / ADAPTER_WEIGHTS).is_file():
        raise FileNotFoundError(f"no adapter weights at {path / ADAPTER_WEIGHTS}")
    name = getattr(model, "active_adapter", "default")
    result = set_peft_model_state_dict(model, load_peft_weights(str(path), device="cpu"), adapter_name=name)
    unexpected = getattr(result, "unexpected_keys", None) or []
    if unexpected:
        raise ValueError(f"{path}: adapter weights do not fit the policy (unexpected keys {unexpected[:3]}...)")


def sft_args(config: RestConfig, out_dir: Path) -> Any:
    """The `trl.SFTConfig` of one SFT step."""
    import torch
    from trl import SFTConfig

    on_cpu = not torch.cuda.is_available()
    kwargs: dict[str, Any] = {
        "output_dir": str(out_dir),
        "learning_rate": config.learning_rate,
        "lr_scheduler_type": config.lr_scheduler_type,
        "warmup_steps": config.warmup_ratio,  # below 1: a ratio of the total steps (transformers 5)
        "max_grad_norm": config.max_grad_norm,
        "num_train_epochs": config.epochs,
        "per_device_train_batch_size": config.batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "gradient_checkpointing": config.gradient_checkpointing,
        "seed": config.seed,
        "completion_only_loss": True,
        "max_length": None,  # lengths are checked before (an over-long example is left out, not cut)
        "save_strategy": "no",
        "report_to": "none",
        "logging_steps": 1,
        "disable_tqdm": False,
        "use_cpu": on_cpu,
        "bf16": (not on_cpu) and torch.cuda.is_bf16_supported(),
    }
    kwargs.update(config.sft_overrides)
    return SFTConfig(**kwargs)


def sft_state(config: RestConfig, out_dir: Path) -> Any:
    """accelerate's `PartialState` as the SFT step sees it: which process this is, of how many.

    Building the `SFTConfig` sets it up (transformers resets accelerate's state there). Asking for a
    bare `PartialState()` first is not the same: on CPU under `accelerate launch --num_processes 2`
    it reports one process (its default is not CPU), so every process would take itself for the
    main one."""
    return sft_args(config, out_dir).distributed_state


def train_sft(
    model: Any, tokenizer: Any, examples: list[dict[str, list[int]]], config: RestConfig, out_dir: Path
) -> float | None:
    """One SFTTrainer run over pre-tokenized examples (completion-only loss); returns the mean loss."""
    from datasets import Dataset
    from trl import SFTTrainer

    args = sft_args(config, out_dir)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(examples),
        processing_class=tokenizer,
    )
    result = trainer.train()
    loss = getattr(result, "training_loss", None)
    del trainer
    return float(loss) if loss is not None else None
