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
from typing import Any

from vprl.executor.program import ENTRY
from vprl.train.prompts import encode_prompt, frame_prompt
from vprl.train.runs.folder import ADAPTER_WEIGHTS


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


def iteration_args(sft: Any, out_dir: Path) -> Any:
    """The recipe's `SFTConfig` for one iteration's SFT step: its own folder, the loss on the program
    only, no length cut (an over-long example was left out before) and no checkpoints (the loop saves
    the adapter itself). Everything else (schedule, warmup, batch, reporting) is the recipe's."""
    import torch

    return dataclasses.replace(
        sft,
        output_dir=str(out_dir),
        completion_only_loss=True,
        max_length=None,
        save_strategy="no",
        use_cpu=sft.use_cpu or not torch.cuda.is_available(),
    )


def sft_state(sft: Any, out_dir: Path) -> Any:
    """accelerate's `PartialState` as the SFT step sees it: which process this is, of how many.

    Building the `SFTConfig` sets it up (transformers resets accelerate's state there). Asking for a
    bare `PartialState()` first is not the same: on CPU under `accelerate launch --num_processes 2`
    it reports one process (its default is not CPU), so every process would take itself for the
    main one."""
    return iteration_args(sft, out_dir).distributed_state


def train_sft(
    model: Any, tokenizer: Any, examples: list[dict[str, list[int]]], sft: Any, out_dir: Path
) -> float | None:
    """One SFTTrainer run over pre-tokenized examples (completion-only loss); returns the mean loss."""
    from datasets import Dataset
    from trl import SFTTrainer

    args = iteration_args(sft, out_dir)
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
