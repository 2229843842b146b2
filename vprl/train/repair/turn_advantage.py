"""A turn-level advantage for the programs written after feedback (`repair_turn_advantage`, grpo with
`repair_branches` > 1).

Why: with one advantage per sequence, a later program carries the episode's group-relative reward,
which mixes how good its first program was with how well it was repaired; under RL the second
turn's use of its feedback fades while the first program improves (docs/benchmarks.md, 2026-12-02).
With `repair_branches` B the rows of a block share their first program and its feedback: one state,
B actions. That is GiGPO's step-level group (Feng et al. 2025, groups of actions taken from one
state; docs/repair.md): the later programs' own advantage is a row's advantage less its block's
mean, and GiGPO adds it, weighted, to the episode's. On the group's scale rather than the block's
own: with blocks of 2, a block's own std would turn any difference, however small, into +-1.

So for weight w, per completion token of row i in block b(i):

- first-turn tokens (everything before the row's first feedback token): A_i, as without it (the
  first program, shared by the block's rows, gets the sum of their advantages, as before);
- later tokens: A_i + w * (A_i - mean_{j in b(i)} A_j).

Feedback tokens are masked out of the loss by trl whatever they hold. trl 1.16's loss takes
advantages of shape (B, T) as they are (`_compute_loss`), and its batch shuffling splits any tensor
by rows, so the per-token advantages replace the per-row ones in the batch trl keeps; the per-row
ones stay in trl's logs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vprl.train.repair.later_kl import first_turn_mask


def turn_advantages(
    advantages: torch.Tensor, sources: Sequence[int], tool_mask: torch.Tensor, weight: float
) -> torch.Tensor:
    """Per-token advantages (rows x completion positions): `advantages` (one per row) on first-turn
    tokens, plus `weight` times the row's advantage less its block's mean on the later ones. A
    block is the rows with the same `sources` entry (the row whose first program they continue)."""
    rows = advantages.size(0)
    if len(sources) != rows or tool_mask.size(0) != rows:
        raise ValueError(f"{rows} advantages, {len(sources)} block sources and {tool_mask.size(0)} mask rows")
    block = torch.as_tensor(list(sources), device=advantages.device)
    sums = torch.zeros_like(advantages).index_add_(0, block, advantages)
    own = advantages - sums[block] / torch.bincount(block, minlength=rows)[block]
    later = ~first_turn_mask(tool_mask)
    return advantages.unsqueeze(1) + weight * own.unsqueeze(1) * later


class TurnAdvantageMixin:
    """Mixed in front of GRPOTrainer's program mixins (so it sees the advantages after rows are
    filtered); `repair_turn_advantage` > 0 switches it on."""

    repair_turn_advantage: float = 0.0

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if not self.repair_turn_advantage or not self.model.training:
            return output
        if output.get("tool_mask") is None:
            raise RuntimeError("repair_turn_advantage needs the episodes' env_mask; this batch has none")
        sources = self.rollout_func.last_sources
        if len(sources) != output["advantages"].size(0):
            raise RuntimeError(f"{len(sources)} block sources for {output['advantages'].size(0)} advantages")
        output["advantages"] = turn_advantages(
            output["advantages"], sources, output["tool_mask"], self.repair_turn_advantage
        )
        return output
