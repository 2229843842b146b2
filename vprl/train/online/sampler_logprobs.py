"""vLLM's sampling log-probabilities on the trainer's footing, for trl's importance-sampling correction.

trl (1.16) corrects for the gap between vLLM and the trained model by weighting each sequence (or
token) with exp(trainer log-prob - vLLM log-prob). Two things make that weight wrong for programs:

- **The sampler truncates.** trl runs vLLM with `logprobs_mode="processed_logprobs"`: the
  log-probability of a token under the distribution it was drawn from, after temperature, min-p,
  top-k and top-p, renormalised over the tokens those filters kept. The trainer's log-probability is
  taken after temperature only. With `top_p` 0.9 every token's vLLM log-probability is higher by
  -log(kept mass), so every sequence is down-weighted by the product of its nucleus masses even when
  vLLM and the trainer agree exactly. `untruncate` adds the log of the kept mass back, with the mass
  computed from the trainer's own logits by vLLM's rules, so a sampler that draws from the policy
  gives a ratio of 1 and the gradient of the path without vLLM.
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
from collections.abc import Sequence
from contextlib import nullcontext
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


@torch.no_grad()
def completion_kept_log_mass(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    filters: SamplerFilters,
    pad_token_id: int,
    batch_size: int,
    autocast: Any = None,
) -> list[list[float]]:
    """`kept_log_mass` at every completion token, from `model`'s logits. Laid out as trl lays out its
    log-probability pass (prompts padded on the left, completions on the right; causal models with
    rotary positions see the same relative positions), and only the completion positions' logits are
    computed."""
    device = next(model.parameters()).device
    out: list[list[float]] = []
    for start in range(0, len(prompt_ids), batch_size):
        prompts = prompt_ids[start : start + batch_size]
        completions = completion_ids[start : start + batch_size]
        p_len, c_len = max(len(p) for p in prompts), max(max(len(c) for c in completions), 1)
        ids = torch.full((len(prompts), p_len + c_len), pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            ids[row, p_len - len(p) : p_len] = torch.tensor(p, dtype=torch.long)
            ids[row, p_len : p_len + len(c)] = torch.tensor(list(c), dtype=torch.long)
            mask[row, p_len - len(p) : p_len + len(c)] = 1
        with autocast or nullcontext():
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), logits_to_keep=c_len + 1).logits[
                :, :-1
            ]
        mass = kept_log_mass(logits, filters).cpu()
        out += [mass[row, : len(c)].tolist() for row, c in enumerate(completions)]
    return out


def untruncate(
    logprobs: Sequence[Sequence[float | None]], log_mass: Sequence[Sequence[float]]
) -> list[list[float | None]]:
    """vLLM's processed log-probabilities plus the log of the kept mass: the log-probability under
    the temperature-scaled distribution, which is what the trainer computes. None stays None."""
    return [
        [None if lp is None else lp + m for lp, m in zip(row, masses, strict=True)]
        for row, masses in zip(logprobs, log_mass, strict=True)
    ]
