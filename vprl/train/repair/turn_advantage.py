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
  turn-level credit, Zeng et al. 2025: the turn's own advantage plus the outcome's); `none` gives
  them 0, so only the later programs are trained (whether the second turn's reading fades when the
  first program is not trained at all).
- `repair_first_weight` w1 (the first turn): its tokens carry w1 times what `repair_first_credit`
  gives them, so that below 1 the first program moves slower than the later ones (the later
  programs' reading of their feedback fades as the first program trains).
- `repair_later_credit` (the later turns): `episode` (the default) gives them A_i; `fresh` gives
  them L_i = (R_i - b_i) / s: the episode's reward R_i less b_i, the mean reward of the first
  programs of its group's other rows (other blocks with branches): what a fresh sample of the
  question earns. Why: the episode's baseline is the group's final rewards, so a wrong first program
  repaired earns what a right first program earns, and nothing at all where every episode ended
  right; against the fresh sample the second program is paid for doing better than writing the
  question's program again (`repair/resample_lift`, as an advantage). s is the std of the group's
  first and final rewards together (the batch's with `scale_rewards: batch`, 1 with `none`): never 0
  unless every reward of the group is equal, when R_i - b_i is 0 too.
- `repair_turn_advantage` w (the later turns; `repair_branches` > 1): the rows of a block share
  their first program and its feedback: one state, B actions, GiGPO's step-level group (Feng et al.
  2025). Later tokens get A_i + w (A_i - m_b(i)) (L_i in place of A_i with `fresh`), m_b the
  block's mean advantage: on the group's scale rather than the block's own (with blocks of 2 a
  block's std would turn any difference, however small, into +-1).

First-turn tokens are everything before the row's first feedback token (a one-turn episode's
whole program). Feedback tokens are masked out of the loss by trl whatever they hold; the per-row
advantages stay in trl's logs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from trl.trainer.utils import nanstd

from vprl.train.repair.later_kl import first_turn_mask
from vprl.train.repair.turns import FIRST_CREDITS, LATER_CREDITS


def turn_advantages(
    advantages: torch.Tensor,
    sources: Sequence[int],
    tool_mask: torch.Tensor,
    weight: float,
    first: torch.Tensor | None = None,
    later: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token advantages (rows x completion positions): `first` (one per row; None: `advantages`)
    on first-turn tokens; `later` (None: `advantages`) plus `weight` times the row's `later` less its
    block's mean on the later ones. A block is the rows with the same `sources` entry (the row whose
    first program they continue)."""
    rows = advantages.size(0)
    if len(sources) != rows or tool_mask.size(0) != rows:
        raise ValueError(f"{rows} advantages, {len(sources)} block sources and {tool_mask.size(0)} mask rows")
    for name, given in (("first", first), ("later", later)):
        if given is not None and given.shape != advantages.shape:
            raise ValueError(f"{rows} advantages and {tuple(given.shape)} {name}-turn advantages")
    base = advantages if later is None else later
    block = torch.as_tensor(list(sources), device=advantages.device)
    sums = torch.zeros_like(base).index_add_(0, block, base)
    own = base - sums[block] / torch.bincount(block, minlength=rows)[block]
    opening = first_turn_mask(tool_mask)
    later_tokens = (base + weight * own).unsqueeze(1).expand(-1, tool_mask.size(1))
    return torch.where(opening, (advantages if first is None else first).unsqueeze(1), later_tokens)


def fresh_advantages(
    finals: torch.Tensor, firsts: torch.Tensor, blocks: torch.Tensor, group: int, scale: str
) -> torch.Tensor:
    """Each row's `finals` (its episode's reward) less the mean of `firsts` (first programs' rewards)
    over the rows of its group outside its block (`blocks`: one id per row), over the std of the
    group's first and final rewards together (`scale`: as trl's `scale_rewards`). NaN rewards (never
    judged) are left out of the statistics; a row with a NaN reward, or with no other first program
    judged, gets 0."""
    if not (finals.shape == firsts.shape == blocks.shape) or finals.numel() % group:
        raise ValueError(f"{tuple(finals.shape)} finals, {tuple(firsts.shape)} firsts, {tuple(blocks.shape)} blocks")
    f, b = firsts.view(-1, group), blocks.view(-1, group)
    others = (b.unsqueeze(2) != b.unsqueeze(1)) & ~torch.isnan(f).unsqueeze(1)  # (groups, row, other row)
    counts = others.sum(2)
    sums = torch.where(others, f.unsqueeze(1), torch.zeros_like(f).unsqueeze(1)).sum(2)
    baseline = torch.where(counts > 0, sums / counts.clamp(min=1), torch.full_like(sums, float("nan"))).flatten()
    pooled = torch.cat([f, finals.view(-1, group)], dim=1)
    if scale == "group":
        std = nanstd(pooled, dim=1).repeat_interleave(group) + 1e-4
    elif scale == "batch":
        std = nanstd(pooled.flatten()).expand_as(finals) + 1e-4
    elif scale == "none":
        std = torch.ones_like(finals)
    else:
        raise ValueError(f"scale_rewards {scale!r} is not one of group, batch, none")
    return torch.nan_to_num((finals - baseline) / torch.nan_to_num(std, nan=1e-4), nan=0.0)


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
    filtered); `repair_turn_advantage` > 0, a `repair_first_credit` or `repair_later_credit` other
    than `episode`, or a `repair_first_weight` other than 1 switches it on."""

    repair_turn_advantage: float = 0.0
    repair_first_credit: str = "episode"
    repair_first_weight: float = 1.0
    repair_later_credit: str = "episode"

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        credit = self.repair_first_credit
        if credit not in FIRST_CREDITS:
            raise ValueError(f"repair_first_credit {credit!r} is not one of {', '.join(FIRST_CREDITS)}")
        if self.repair_later_credit not in LATER_CREDITS:
            raise ValueError(
                f"repair_later_credit {self.repair_later_credit!r} is not one of {', '.join(LATER_CREDITS)}"
            )
        plain = (
            not self.repair_turn_advantage
            and credit == "episode"
            and self.repair_later_credit == "episode"
            and self.repair_first_weight == 1.0
        )
        if plain or not self.model.training:
            return output
        if output.get("tool_mask") is None:
            raise RuntimeError("turn-level advantages need the episodes' env_mask; this batch has none")
        advantages = output["advantages"]
        sources = self.rollout_func.last_sources
        if len(sources) != advantages.size(0):
            raise RuntimeError(f"{len(sources)} block sources for {advantages.size(0)} advantages")
        first = later = None
        if credit == "none":
            first = torch.zeros_like(advantages)
        elif credit != "episode":
            firsts = group_advantages(self._gathered_firsts(advantages), self.num_generations, self.scale_rewards)
            first = self._mine(firsts, advantages)
            if credit == "both":
                first = first + advantages
        if self.repair_first_weight != 1.0:
            first = (advantages if first is None else first) * self.repair_first_weight
        if self.repair_later_credit == "fresh":
            later = self._mine(self._fresh_advantages(advantages, sources), advantages)
        output["advantages"] = turn_advantages(
            advantages, sources, output["tool_mask"], self.repair_turn_advantage, first, later
        )
        return output

    def _gathered_firsts(self, advantages: torch.Tensor) -> torch.Tensor:
        """Every process's rows' first programs' own totals (NaN: never judged), gathered over the
        processes in trl's order, so grouped as trl groups the episodes' rewards."""
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise RuntimeError(
                "repair credit: the turns' advantages are computed like trl's sum_then_normalize; "
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
        return self.accelerator.gather(totals)

    def _fresh_advantages(self, advantages: torch.Tensor, sources) -> torch.Tensor:
        """`fresh_advantages` over the gathered batch: the episodes' rewards as trl sums them, each
        process's block sources moved to its rows' place in the gathered batch."""
        per_func = self._last_rewards_per_func.to(advantages.device)
        finals = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        finals[torch.isnan(per_func).all(dim=1)] = float("nan")
        offset = self.accelerator.process_index * advantages.size(0)
        blocks = self.accelerator.gather(torch.as_tensor(list(sources), device=advantages.device) + offset)
        return fresh_advantages(
            finals, self._gathered_firsts(advantages), blocks, self.num_generations, self.scale_rewards
        )

    def _mine(self, gathered: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
        """This process's rows (as many as its `advantages`) of a gathered per-row tensor; 0 where the
        episode was never judged (every reward None: trl's advantage 0)."""
        gathered = gathered.clone()
        gathered[torch.isnan(self._last_rewards_per_func).all(dim=1).to(gathered.device)] = 0.0
        start = self.accelerator.process_index * advantages.size(0)
        return gathered[start : start + advantages.size(0)].to(advantages.dtype)
