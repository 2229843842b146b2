"""GRPO's KL to the reference on the later turns of repair episodes only (`repair_kl_turns: later`).

Why: under RL with the final program's reward, the second program's use of its feedback fades
(`repair/resample_lift` falls to about 0 within a few dozen steps while the first program improves;
docs/benchmarks.md, 2026-12-02). The reference (the policy before RL: with a new LoRA, the model with
the adapter disabled) reads its feedback. A KL on every token holds the first program back as much
as the repairs; this one leaves the first program free and keeps only the later programs near it.

How, with trl's own loss: trl adds `beta * k3(ref - logp)` per token, where k3(x) = exp(x) - x - 1.
At ref = logp (detached) both the term and its gradient are exactly 0. So the loss's own
log-probability pass is watched, and on a copy of the batch the reference log-probabilities of every
first-turn token (everything before the first feedback block, and whole one-turn episodes) are set
to the policy's own: those tokens then get the policy-gradient term alone. The batch itself is not
changed (trl reuses it over `num_iterations`).
"""

from __future__ import annotations

from typing import Any

import torch

REF = "ref_per_token_logps"


def first_turn_mask(tool_mask: torch.Tensor) -> torch.Tensor:
    """Bool per completion position: before the row's first feedback token (tool_mask 0)."""
    return torch.cumsum(1 - tool_mask.long(), dim=1) == 0


class LaterTurnsKLMixin:
    """Mixed in front of GRPOTrainer; `kl_later_turns_only` switches it on."""

    kl_later_turns_only: bool = False
    _kl_batch: dict[str, Any] | None = None

    def _compute_loss(self, model, inputs):
        if not self.kl_later_turns_only or inputs.get(REF) is None:
            return super()._compute_loss(model, inputs)
        if inputs.get("tool_mask") is None:
            raise RuntimeError("repair_kl_turns: later needs the episodes' env_mask; this batch has none")
        batch = dict(inputs)
        self._kl_batch = batch
        try:
            loss = super()._compute_loss(model, batch)
        finally:
            pending, self._kl_batch = self._kl_batch, None
        if pending is not None:
            raise RuntimeError("repair_kl_turns: trl's loss computed no log-probabilities; this trl version differs")
        return loss

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        batch, self._kl_batch = self._kl_batch, None  # only the loss's own pass, once
        if batch is not None:
            logps = out[0]
            first = first_turn_mask(batch["tool_mask"]).to(logps.device)
            if first.shape != logps.shape:
                raise RuntimeError(
                    f"tool_mask {tuple(first.shape)} does not match the log-probabilities {tuple(logps.shape)}"
                )
            batch[REF] = torch.where(first, logps.detach(), batch[REF])
        return out
