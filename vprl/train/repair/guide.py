"""Guided second turns (`repair_guide_weight`): the mistakes the policy still makes, each followed by
a right program of its question that the same batch found, trained as SFT beside GRPO's loss.

Why: RL over repair episodes folds the mistakes feedback can fix into the first program and forgets
how to fix the rest (docs/benchmarks.md, "Whose repairer is it?"); the bootstrap's repair examples
show the mistakes of the gold programs' mutations, not the trained policy's. Here, each step, a row
whose first program was wrong and got feedback is shown, in its own context (prompt, its first
program, its feedback block as sampled and masked), a right final program of the same question from
another row of the batch, as sampled there (its tokens, never re-tokenized). The guide's NLL over
those tokens, weighted, joins the loss; the RL term is trl's, unchanged. No answer is read: "right"
is the episode's own judgement (`Turn.right`: the correctness reward where the run has labels, the
unit-test pass where it has none).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

GUIDE_IDS, GUIDE_MASK = "repair_guide_ids", "repair_guide_mask"


def guide_targets(episodes: Sequence[Any], usable: Sequence[bool] | None = None) -> list[int | None]:
    """Per row: the row whose final program guides it (the first row of its question whose final
    program is right and not its own), or None where its first program was right, got no feedback
    (one turn), or no row of its question ended right. Rows not `usable` (masked out whole by the
    trainer) neither guide nor are guided."""
    usable = [True] * len(episodes) if usable is None else list(usable)
    right_rows: dict[str, list[int]] = {}
    for i, e in enumerate(episodes):
        if e.final.right() and usable[i]:
            right_rows.setdefault(e.example_id, []).append(i)
    out: list[int | None] = []
    for i, e in enumerate(episodes):
        if len(e.turns) < 2 or e.first.right() or not usable[i]:
            out.append(None)
            continue
        out.append(next((r for r in right_rows.get(e.example_id, []) if r != i), None))
    return out


def guide_batch(
    episodes: Sequence[Any],
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    env_mask: torch.Tensor,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, right-padded: its prompt, its completion up to its second program (first program and
    feedback block), then the guiding row's final program; the mask is 1 on the guiding program's
    tokens only. Rows without a guide are all padding with a zero mask."""
    sequences: list[list[int]] = []
    targets: list[int] = []
    lengths = [int(n) for n in completion_mask.sum(1)]
    # A row the trainer masked out whole (mask_truncated_completions) neither is guided nor guides.
    for i, source in enumerate(guide_targets(episodes, [n > 0 for n in lengths])):
        env = env_mask[i][: lengths[i]].tolist()
        if source is None or 0 not in env:
            sequences.append([])
            targets.append(0)
            continue
        m = lengths[source]
        prompt = prompt_ids[i][prompt_mask[i].bool()].tolist()
        second = _second_turn_start(env)
        final = _last_turn_start(env_mask[source][:m].tolist())
        target = completion_ids[source][final:m].tolist()
        sequences.append(prompt + completion_ids[i][:second].tolist() + target)
        targets.append(len(target))
    width = max((len(s) for s in sequences), default=0)
    ids = torch.full((len(sequences), max(width, 1)), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (seq, k) in enumerate(zip(sequences, targets, strict=True)):
        if seq:
            ids[i, : len(seq)] = torch.tensor(seq)
            mask[i, len(seq) - k : len(seq)] = 1
    return ids.to(completion_ids.device), mask.to(completion_ids.device)


def _second_turn_start(env: list[int]) -> int:
    """Where the first program tokens after the first feedback block begin."""
    first_feedback = env.index(0)
    return first_feedback + env[first_feedback:].index(1)


def _last_turn_start(env: list[int]) -> int:
    """Where the last run of program tokens begins (0 for a one-turn episode)."""
    k = len(env)
    while k > 0 and env[k - 1] == 1:
        k -= 1
    return k


def guide_nll(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
    """The mean NLL of the masked tokens, each predicted from everything before it, over the rows
    that have any; None where none has. Padding follows each row's last target token, so causal
    attention keeps it out of every prediction that counts."""
    rows = mask.sum(1) > 0
    if not bool(rows.any()):
        return None
    ids, mask = ids[rows], mask[rows]
    positions = torch.arange(ids.size(1), device=ids.device)
    width = int((mask * positions).max()) + 1  # through the last target token of any row
    ids, mask = ids[:, :width], mask[:, :width]
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, :-1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(2, ids[:, 1:].unsqueeze(2)).squeeze(2)
    weights = mask[:, 1:].to(logp.dtype)
    return -(logp * weights).sum() / weights.sum()


class RepairGuideMixin:
    """Mixed into GRPOTrainer behind ProgramTrainerMixin (so the guide is built before any row is
    filtered out of the mask); `repair_guide_weight` > 0 switches it on."""

    repair_guide_weight: float = 0.0

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if not self.repair_guide_weight or not self.model.training:
            return output
        if output.get("tool_mask") is None:
            raise RuntimeError("repair_guide_weight needs the episodes' env_mask; this batch has none")
        episodes = self.rollout_func.last_episodes
        if len(episodes) != output["completion_ids"].size(0):
            raise RuntimeError(f"{len(episodes)} episodes for {output['completion_ids'].size(0)} completions")
        tokenizer = self.processing_class
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        ids, mask = guide_batch(
            episodes,
            output["prompt_ids"],
            output["prompt_mask"],
            output["completion_ids"],
            output["completion_mask"],
            output["tool_mask"],
            pad,
        )
        output[GUIDE_IDS], output[GUIDE_MASK] = ids, mask
        self._metrics["train"]["repair/guided_share"].append(float((mask.sum(1) > 0).float().mean()))
        return output

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        return plus_sft_term(self, loss, model, inputs, (GUIDE_IDS, GUIDE_MASK), self.repair_guide_weight, "guide")


def plus_sft_term(trainer, loss, model, inputs: dict, keys: tuple[str, str], weight: float, name: str):
    """`loss` plus `weight` times the mean NLL of the target tokens the batch carries under `keys`
    (ids, mask), logged as `repair/<name>_nll`; `loss` alone where this slice of the batch has none."""
    if keys[0] not in inputs:
        return loss
    nll = guide_nll(model, inputs[keys[0]], inputs[keys[1]])
    if nll is None:
        return loss
    trainer._metrics["train"][f"repair/{name}_nll"].append(float(nll.detach()))
    return loss + weight * nll
