"""vLLM's sampling log-probabilities on the trainer's footing, for trl's importance-sampling correction.

trl (1.16) corrects for the gap between vLLM and the trained model by weighting each sequence (or
token) with exp(trainer log-prob - vLLM log-prob). Two things make that weight wrong for programs:

- **The sampler truncates.** trl runs vLLM with `logprobs_mode="processed_logprobs"`: the
  log-probability of a token under the distribution it was drawn from, after temperature, min-p,
  top-k and top-p, renormalised over the tokens those filters kept. The trainer's log-probability is
  taken after temperature only. With `top_p` 0.9 every token's vLLM log-probability is higher by
  -log(kept mass), so every sequence is down-weighted by the product of its nucleus masses even when
  vLLM and the trainer agree exactly. The log of the kept mass, computed from the trainer's own
  logits by vLLM's rules, is added back (`vprl.train.online.trainers`), so a sampler that draws
  from the policy gives a ratio of 1 and the gradient of the path without vLLM. `KeptMassProbe`
  computes it inside trl's own old-log-probability forward, a slice of positions at a time, so it
  costs neither a second forward nor the whole batch's logits.
- **A token the sampler never drew.** A program cut at a stop sequence ends with an EOS the stop rule
  stands for (`vprl.train.online.trainers`). It has no sampling log-probability: it is given `None`,
  vLLM's own mark for a token it could not score, which trl turns into NaN and leaves out of the
  correction (ratio 1).
  A log-probability of 0 would weight the whole sequence by p(EOS | program), about 3e-4.

Penalties (repetition, frequency, presence) change vLLM's distribution in ways that depend on the
whole sequence; `check_correctable` refuses them with the correction on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

NOT_SAMPLED = None  # vLLM's "could not score this token"; trl turns it into NaN and leaves the token out


@dataclass(frozen=True)
class SamplerFilters:
    """The sampling settings vLLM applies before it reports a processed log-probability."""

    temperature: float = 1.0
    top_k: int = 0  # 0 or less: off (vLLM's and trl's convention)
    top_p: float = 1.0
    min_p: float = 0.0

    @classmethod
    def of(cls, trainer: Any) -> SamplerFilters:
        return cls(
            temperature=float(trainer.temperature),
            top_k=int(trainer.top_k or 0),
            top_p=float(1.0 if trainer.top_p is None else trainer.top_p),
            min_p=float(trainer.min_p or 0.0),
        )

    @property
    def truncates(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0


def check_correctable(trainer: Any) -> None:
    """Refuse settings under which vLLM's log-probabilities cannot be put on the trainer's footing."""
    penalty = getattr(trainer, "repetition_penalty", 1.0)
    if penalty not in (None, 1.0):
        raise ValueError(
            f"repetition_penalty {penalty} with vllm_importance_sampling_correction: vLLM reports log-probabilities "
            "after the penalty, which depends on the whole sequence and the trainer cannot reproduce; set "
            "repetition_penalty 1.0 or vllm_importance_sampling_correction false"
        )


def kept_log_mass(logits: torch.Tensor, filters: SamplerFilters) -> torch.Tensor:
    """log of the probability (after temperature) of the tokens vLLM's filters keep, per position.

    vLLM's order: temperature, min-p (tokens below min_p times the top probability go), top-k (ties at
    the k-th logit stay), then top-p on the distribution renormalised over what is left: tokens sorted
    ascending by probability are dropped while the cumulative sum is at most 1 - top_p, never the
    most likely one. `logits`: (..., vocab). Returns (...,), 0 where nothing is filtered."""
    scaled = logits.float() / filters.temperature
    logp = scaled.log_softmax(dim=-1)
    keep = torch.ones_like(logp, dtype=torch.bool)
    if filters.min_p > 0.0:
        keep &= logp >= logp.max(dim=-1, keepdim=True).values + math.log(filters.min_p)
    if 0 < filters.top_k < logp.size(-1):
        kth = logp.masked_fill(~keep, -math.inf).topk(filters.top_k, dim=-1).values[..., -1:]
        keep &= logp >= kth
    if filters.top_p < 1.0:
        probs = logp.masked_fill(~keep, -math.inf).softmax(dim=-1)
        ascending, order = probs.sort(dim=-1)
        drop = ascending.cumsum(dim=-1) <= 1.0 - filters.top_p
        drop[..., -1] = False
        keep &= ~torch.zeros_like(drop).scatter(-1, order, drop)
    return logp.masked_fill(~keep, -math.inf).logsumexp(dim=-1)


# The correction holds the logits of this many bytes' worth of positions at once: a slice's head
# output, its fp32 copy, the log-softmax, the masks and the top-p sort cost about
# `BYTES_PER_ELEMENT` bytes per (position x vocabulary) element (measured: bench/correction_memory.py).
SLICE_BYTES = 128 * 2**20
BYTES_PER_ELEMENT = 48


def slice_positions(vocab: int) -> int:
    """How many positions' logits one slice of the correction holds (at least one)."""
    return max(1, SLICE_BYTES // (BYTES_PER_ELEMENT * vocab))


@dataclass(frozen=True)
class HeadTransform:
    """What a model does to its LM head's output before the softmax (read from its config the way
    trl's fused LM head reads it, so the kept mass sees the logits trl's log-probabilities see):
    a multiplier, then a tanh soft cap."""

    scale: float = 1.0
    softcap: float | None = None

    @classmethod
    def of(cls, config: Any) -> HeadTransform:
        scale = getattr(config, "logit_scale", None)
        if scale is None:
            scale = getattr(config, "output_multiplier", None)
        if scale is None:
            scale = getattr(config, "lm_head_multiplier", None)
        if scale is None and getattr(config, "logits_scaling", None) is not None:
            scaling = config.logits_scaling
            scale = scaling if getattr(config, "model_type", None) == "hyperclovax" else 1 / scaling
        return cls(1.0 if scale is None else float(scale), getattr(config, "final_logit_softcapping", None))

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


@torch.no_grad()
def sliced_kept_log_mass(
    hidden: torch.Tensor, head: Any, filters: SamplerFilters, transform: HeadTransform, vocab: int
) -> torch.Tensor:
    """`kept_log_mass` of the logits `head` gives `hidden` (positions, hidden size), projected and
    filtered `slice_positions(vocab)` positions at a time: the whole batch's logits would be rows x
    positions x vocabulary (22 GiB for CodeGemma's 256,000 at 8 x 321 positions). Each position's
    value is the one `kept_log_mass` gives on the full tensor: every step of it is per position."""
    step = slice_positions(vocab)
    parts = [kept_log_mass(transform(head(hidden[i : i + step])), filters) for i in range(0, hidden.size(0), step)]
    return torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)


class KeptMassProbe:
    """The kept mass at every completion position, computed from the hidden states of trl's own
    old-log-probability forward rather than from a forward of its own.

    While open, a hook on the backbone trl's fused LM head runs (`causal_lm.base_model`) takes each
    chunk's last hidden states as they are made, projects the completion positions through the
    model's own LM head a slice at a time, and keeps only one float per position. trl lays the
    chunk out as prompt (left-padded) then completion (right-padded) and scores the last
    `logits_to_keep` tokens, each from the hidden state before it; positions the attention mask
    leaves out get 0. `mass()`: (rows, logits_to_keep), the rows of every chunk in order."""

    def __init__(self, causal_lm: Any, filters: SamplerFilters, logits_to_keep: int):
        self.backbone = causal_lm.base_model
        self.head = causal_lm.get_output_embeddings()
        config = causal_lm.config.get_text_config()
        self.vocab = int(getattr(self.head, "out_features", None) or config.vocab_size)
        self.transform = HeadTransform.of(config)
        self.filters, self.logits_to_keep = filters, logits_to_keep
        self._chunks: list[torch.Tensor] = []
        self._handle: Any = None

    def __enter__(self) -> KeptMassProbe:
        self._handle = self.backbone.register_forward_hook(self._on_forward, with_kwargs=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.remove()

    @torch.no_grad()
    def _on_forward(self, module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
        width = self.logits_to_keep
        before = hidden[:, -width - 1 : -1]
        attention = kwargs.get("attention_mask")
        if attention is None:
            valid = torch.ones(before.shape[:2], dtype=torch.bool, device=hidden.device)
        else:
            valid = attention[:, -width:].to(hidden.device).bool()
        mass = torch.zeros(valid.shape, dtype=torch.float32, device=hidden.device)
        weight = getattr(self.head, "weight", None)
        positions = before[valid] if weight is None else before[valid].to(weight.device)
        mass[valid] = sliced_kept_log_mass(positions, self.head, self.filters, self.transform, self.vocab).to(
            mass.device
        )
        self._chunks.append(mass)

    def mass(self) -> torch.Tensor:
        if not self._chunks:
            raise RuntimeError("the kept-mass probe saw no forward of the backbone trl's fused LM head runs")
        return torch.cat(self._chunks)
