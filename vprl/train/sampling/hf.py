"""Sampling programs with `transformers` generate: batched over prompts with left padding, on the
policy's own device; works with a peft model (the live adapter is the one sampled).

In a chat frame the turn-end token (CodeGemma's `<end_of_turn>`) ends a completion: no stop string
can see it (they are matched on text decoded with special tokens skipped), so it is passed to
generate as an extra EOS, and each completion is cut there before decoding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vprl.train.prompts import encode_prompt, frame_prompt, turn_end_ids
from vprl.train.sampling.generator import SamplingSettings, cut_at_stop


@dataclass
class HFGenerator:
    """`transformers` generate, batched over prompts with left padding. Works with a peft model."""

    model: Any
    tokenizer: Any
    batch_size: int = 16
    style: str = "auto"
    _pad_side: str = field(default="left", init=False)

    def generate(self, prompts: Sequence[str], sampling: SamplingSettings) -> list[list[str]]:
        import torch

        tok = self.tokenizer
        n = sampling.n
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        ids = [encode_prompt(frame_prompt(p, tok, self.style), tok) for p in prompts]
        # Repeat each prompt n times so one padded batch holds whole groups.
        flat = [(i, seq) for i, seq in enumerate(ids) for _ in range(n)]
        out: list[list[str]] = [[] for _ in prompts]
        turn_end = turn_end_ids(tok, self.style)
        # Per call rather than on the policy's generation config: the policy is the one being trained,
        # and its saved config should not carry the frame's stop.
        eos = self.model.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        eos_ids = [*eos, *(t for t in turn_end if t not in eos)]
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
                        **({"eos_token_id": eos_ids} if turn_end else {}),
                    )
                for row, (i, _) in enumerate(chunk):
                    new = gen[row, width:].tolist()
                    # Other rows of the batch may run on: this row's padding after its turn end is no text.
                    at = next((k for k, t in enumerate(new) if t in turn_end), len(new))
                    text = tok.decode(new[:at], skip_special_tokens=True)
                    out[i].append(cut_at_stop(text, sampling.stop))
        finally:
            self.model.train(was_training)
        return out
