"""Sampling programs from a policy: one protocol, a transformers implementation for CPU.

A `Generator` takes prompt texts (already built by `train.prompts`, not yet framed) and returns,
for each, `n` completions: the text the model wrote after the prompt, cut at the first stop
sequence. `completion_to_program(prompt_tail, completion)` turns a completion into a program.
The vLLM implementation (GPU) lives next to this one and keeps the same signature.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from train.prompts import STOP_SEQUENCES, encode_prompt, frame_prompt


@dataclass(frozen=True)
class SamplingConfig:
    """The papers' sampling settings by default (temperature 1.0, top-p 0.9, 320 new tokens).
    temperature 0 means greedy decoding."""

    temperature: float = 1.0
    top_p: float = 0.9
    max_new_tokens: int = 320
    stop: tuple[str, ...] = STOP_SEQUENCES
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"SamplingConfig.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingConfig.max_new_tokens must be >= 1, got {self.max_new_tokens}")


class Generator(Protocol):
    def generate(self, prompts: Sequence[str], n: int, sampling: SamplingConfig) -> list[list[str]]:
        """`n` completions for each prompt, in prompt order."""
        ...


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """The text up to (not including) the earliest stop sequence."""
    end = len(text)
    for s in stop:
        i = text.find(s)
        if i != -1:
            end = min(end, i)
    return text[:end]


@dataclass
class HFGenerator:
    """`transformers` generate, batched over prompts with left padding. Works with a peft model."""

    model: Any
    tokenizer: Any
    batch_size: int = 16
    style: str = "auto"
    _pad_side: str = field(default="left", init=False)

    def generate(self, prompts: Sequence[str], n: int, sampling: SamplingConfig) -> list[list[str]]:
        import torch

        tok = self.tokenizer
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        ids = [encode_prompt(frame_prompt(p, tok, self.style), tok) for p in prompts]
        # Repeat each prompt n times so one padded batch holds whole groups.
        flat = [(i, seq) for i, seq in enumerate(ids) for _ in range(n)]
        out: list[list[str]] = [[] for _ in prompts]
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(flat), self.batch_size):
                chunk = flat[start : start + self.batch_size]
                width = max(len(seq) for _, seq in chunk)
                input_ids = torch.full((len(chunk), width), tok.pad_token_id, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, (_, seq) in enumerate(chunk):
                    input_ids[row, width - len(seq) :] = torch.tensor(seq)
                    mask[row, width - len(seq) :] = 1
                device = next(self.model.parameters()).device
                greedy = sampling.temperature == 0
                with torch.no_grad():
                    gen = self.model.generate(
                        input_ids=input_ids.to(device),
                        attention_mask=mask.to(device),
                        max_new_tokens=sampling.max_new_tokens,
                        do_sample=not greedy,
                        temperature=None if greedy else sampling.temperature,
                        top_p=None if greedy else sampling.top_p,
                        top_k=None,
                        pad_token_id=tok.pad_token_id,
                        use_cache=True,  # a policy saved from training may say otherwise; nothing trains here
                        stop_strings=list(sampling.stop) or None,
                        tokenizer=tok,
                    )
                for row, (i, _) in enumerate(chunk):
                    text = tok.decode(gen[row, width:], skip_special_tokens=True)
                    out[i].append(cut_at_stop(text, sampling.stop))
        finally:
            self.model.train(was_training)
        return out
