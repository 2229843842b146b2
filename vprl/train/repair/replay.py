"""Replayed repair examples (`repair_replay_weight`): the bootstrap's own repair pairs (a wrong
program, its real feedback, the gold program after it), trained as SFT beside GRPO's loss at every
step, as InstructGPT's PPO-ptx mixes its pretraining data into PPO's loss.

Why: RL over repair episodes moves the first program, and the second turn, which shares its
question-to-program mapping, loses the reading of its feedback the bootstrap gave it: the repair rate
falls within 20-30 steps from every start tried (docs/repair.md). The pairs are the ones the
bootstrap fitted, so the term holds the policy near what it could already do after feedback and
teaches it nothing new; the RL term is trl's, unchanged. No answer is read: the bootstrap built the
pairs label-free (the gold programs are the world's, the feedback its unit tests').

Each step, `repair_replay_rows` of the batch's rows carry one pair, a step's pairs drawn without
replacement while the pool lasts (trl shuffles the rows and slices them for gradient accumulation: each
slice's term is the mean over its own replayed rows). A pair is tokenized as trl's SFT tokenized it
(`tokenize_pair`); the loss is on the gold program's tokens. Their mean NLL, times the weight, joins
the loss (`plus_sft_term`, as for the guide).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vprl.train.bootstrap.pairs import SFTPair
from vprl.train.repair.guide import plus_sft_term

REPLAY_IDS, REPLAY_MASK = "repair_replay_ids", "repair_replay_mask"


def tokenize_pair(pair: SFTPair, tokenizer: Any) -> tuple[list[int], int]:
    """The pair's ids as trl's SFT saw them (prompt + completion + the EOS token's text, tokenized
    whole) and how many of the last ones are its target: those after the longest prefix shared
    with the prompt's own ids, where trl's SFT starts the completion."""
    eos = tokenizer.eos_token or ""
    completion = pair.completion if pair.completion.endswith(eos) else pair.completion + eos
    prompt = tokenizer(pair.prompt)["input_ids"]
    ids = tokenizer(pair.prompt + completion)["input_ids"]
    shared = 0
    while shared < min(len(prompt), len(ids)) and prompt[shared] == ids[shared]:
        shared += 1
    if shared == len(ids):
        raise ValueError(f"repair pair of {pair.example_id}: its completion is empty")
    return ids, len(ids) - shared


def replay_rows(batch: int, rows: int) -> list[int]:
    """The `rows` (at most `batch`) row indices that carry a pair, spread evenly over the batch."""
    rows = min(rows, batch)
    return sorted({(i * batch) // rows for i in range(rows)})


def replay_batch(
    pool: Sequence[tuple[list[int], int]], batch: int, rows: int, rng: np.random.Generator, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """[batch, width] ids and target mask, right-padded: `rows` rows each hold a pair drawn from
    `pool` (no pair twice in one batch while the pool lasts), the others are padding with a zero mask."""
    carriers = replay_rows(batch, rows)
    drawn = rng.choice(len(pool), size=len(carriers), replace=len(carriers) > len(pool))
    seqs = {row: pool[int(k)] for row, k in zip(carriers, drawn, strict=True)}
    width = max(len(ids) for ids, _ in seqs.values())
    ids = torch.full((batch, width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (seq, k) in seqs.items():
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, len(seq) - k : len(seq)] = 1
    return ids, mask


class RepairReplayMixin:
    """Mixed into GRPOTrainer; `repair_replay_weight` > 0 with a pool (`set_replay_pairs`) switches it
    on."""

    repair_replay_weight: float = 0.0
    repair_replay_rows: int = 8
    _replay_pool: list[tuple[list[int], int]] | None = None
    _replay_rng: np.random.Generator | None = None

    def set_replay_pairs(self, pairs: Sequence[SFTPair], seed: int) -> None:
        if not pairs:
            raise ValueError("repair_replay_pairs: the file holds no repair pair")
        self._replay_pool = [tokenize_pair(p, self.processing_class) for p in pairs]
        # each process draws its own rows: distinct pairs across ranks, the same ones on a rerun
        self._replay_rng = np.random.default_rng([seed, self.accelerator.process_index, 11])

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if not self.repair_replay_weight or not self.model.training:
            return output
        if self._replay_pool is None:
            raise RuntimeError("repair_replay_weight > 0 needs the pairs (set_replay_pairs) before training")
        tokenizer = self.processing_class
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        batch = output["completion_ids"].size(0)
        ids, mask = replay_batch(self._replay_pool, batch, self.repair_replay_rows, self._replay_rng, pad)
        device = output["completion_ids"].device
        output[REPLAY_IDS], output[REPLAY_MASK] = ids.to(device), mask.to(device)
        return output

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        keys = (REPLAY_IDS, REPLAY_MASK)
        return plus_sft_term(self, loss, model, inputs, keys, self.repair_replay_weight, "replay")
