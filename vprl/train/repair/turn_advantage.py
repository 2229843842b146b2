"""Turn-level advantages for repair episodes (grpo): what each turn's tokens carry, where one
advantage per sequence would give every token the episode's.

Why: with one advantage per sequence, every program token of an episode carries its group-relative
reward, which mixes how good its first program was with how well it was repaired; under RL the
second turn's use of its feedback fades while the first program improves (docs/benchmarks.md,
2026-12-02). Two separate levers, both per token through trl 1.16's loss (`_compute_loss` takes
advantages of shape (B, T) as they are; its batch shuffling splits any tensor by rows):

- `repair_first_credit` (the first turn): `episode` (the default) gives its tokens the episode's
  advantage A_i, which pays a wrong first program whose repair succeeds; `own` gives them the
  group-relative advantage F_i of the first program's own reward, computed as trl computes the
  episode's (same groups, same `scale_rewards`), so the first program is trained as a one-turn run
  trains it and only the later programs answer for the repair; `both` gives F_i + A_i (MT-GRPO's
  turn-level credit, Zeng et al. 2025: the turn's own advantage plus the outcome's).
- `repair_turn_advantage` w (the later turns; `repair_branches` > 1): the rows of a block share
  their first program and its feedback: one state, B actions, GiGPO's step-level group (Feng et al.
  2025). Later tokens get A_i + w (A_i - m_b(i)), m_b the block's mean advantage: on the group's
  scale rather than the block's own (with blocks of 2 a block's std would turn any difference,
  however small, into +-1).

First-turn tokens are everything before the row's first feedback token (a one-turn episode's
whole program). Feedback tokens are masked out of the loss by trl whatever they hold; the per-row
advantages stay in trl's logs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from trl.trainer.utils import nanstd

from vprl.train.repair.later_kl import first_turn_mask
from vprl.train.repair.turns import FIRST_CREDITS


def turn_advantages(
    advantages: torch.Tensor,
    sources: Sequence[int],
    tool_mask: torch.Tensor,
    weight: float,
    first: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token advantages (rows x completion positions): `first` (one per row; None: `advantages`)
    on first-turn tokens; `advantages` plus `weight` times the row's advantage less its block's mean
    on the later ones. A block is the rows with the same `sources` entry (the row whose first
    program they continue)."""
    rows = advantages.size(0)
    if len(sources) != rows or tool_mask.size(0) != rows:
        raise ValueError(f"{rows} advantages, {len(sources)} block sources and {tool_mask.size(0)} mask rows")
    if first is not None and first.shape != advantages.shape:
        raise ValueError(f"{rows} advantages and {tuple(first.shape)} first-turn advantages")
    block = torch.as_tensor(list(sources), device=advantages.device)
    sums = torch.zeros_like(advantages).index_add_(0, block, advantages)
    own = advantages - sums[block] / torch.bincount(block, minlength=rows)[block]
    opening = first_turn_mask(tool_mask)
    later = (advantages + weight * own).unsqueeze(1).expand(-1, tool_mask.size(1))
    return torch.where(opening, (advantages if first is None else first).unsqueeze(1), later)


def group_advantages(rewards: torch.Tensor, group: int, scale: str) -> torch.Tensor:
    """trl 1.16's advantages of summed rewards (`multi_objective_aggregation: sum_then_normalize`):
    less the group's mean, over the group's (`group`) or the batch's (`batch`) std or not at all
    (`none`); a NaN reward (never judged) is left out of the statistics and gets 0."""
    grouped = rewards.view(-1, group)
    centred = (grouped - torch.nanmean(grouped, dim=1, keepdim=True)).flatten()
    if scale == "group":
        std = nanstd(grouped, dim=1).repeat_interleave(group) if group > 1 else torch.zeros_like(rewards)
    elif scale == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    elif scale == "none":
        std = None
    else:
        raise ValueError(f"scale_rewards {scale!r} is not one of group, batch, none")
    out = centred if std is None else centred / (std + 1e-4)
    return torch.nan_to_num(out, nan=0.0)


class TurnAdvantageMixin:
    """Mixed in front of GRPOTrainer's program mixins (so it sees the advantages after rows are
    filtered); `repair_turn_advantage` > 0 or `repair_first_credit` other than `episode` switches it
    on."""

    repair_turn_advantage: float = 0.0
    repair_first_credit: str = "episode"

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        credit = self.repair_first_credit
        if credit not in FIRST_CREDITS:
            raise ValueError(f"repair_first_credit {credit!r} is not one of {', '.join(FIRST_CREDITS)}")
        if (not self.repair_turn_advantage and credit == "episode") or not self.model.training:
            return output
        if output.get("tool_mask") is None:
            raise RuntimeError("turn-level advantages need the episodes' env_mask; this batch has none")
        advantages = output["advantages"]
        sources = self.rollout_func.last_sources
        if len(sources) != advantages.size(0):
            raise RuntimeError(f"{len(sources)} block sources for {advantages.size(0)} advantages")
        first = None
        if credit != "episode":
            first = self._first_program_advantages(advantages)
            if credit == "both":
                first = first + advantages
        output["advantages"] = turn_advantages(
            advantages, sources, output["tool_mask"], self.repair_turn_advantage, first
        )
        return output

    def _first_program_advantages(self, advantages: torch.Tensor) -> torch.Tensor:
        """This process's rows' group-relative advantages of their first programs' own totals,
        gathered over the processes and grouped as trl groups the episodes' rewards. A row whose
        episode was never judged (every reward None: trl's advantage 0) gets 0 here too."""
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise RuntimeError(
                "repair_first_credit: the first programs' advantage is computed like trl's sum_then_normalize; "
                f"this trainer has multi_objective_aggregation {self.multi_objective_aggregation!r}"
            )
        episodes = self.rollout_func.last_episodes
        if len(episodes) != advantages.size(0):
            raise RuntimeError(f"{len(episodes)} episodes for {advantages.size(0)} advantages")
        totals = torch.tensor(
            [float("nan") if e.first.total is None else float(e.first.total) for e in episodes],
            dtype=torch.float32,
            device=advantages.device,
        )
        gathered = self.accelerator.gather(totals)
        first = group_advantages(gathered, self.num_generations, self.scale_rewards)
        first[torch.isnan(self._last_rewards_per_func).all(dim=1).to(first.device)] = 0.0
        start = self.accelerator.process_index * advantages.size(0)
        return first[start : start + advantages.size(0)].to(advantages.dtype)
