"""Repair episodes under trl's RLOOTrainer, which takes no `rollout_func`.

RLOO's `_generate` tokenizes the prompts and calls `_generate_single_turn` once; here that one call
plays the whole episode (`RepairRollout`, as under GRPO: the turns are sampled by RLOO's own
`_generate_single_turn`, vLLM or transformers, and never re-tokenized) and returns each episode's
tokens, so RLOO decodes, logs and scores whole episodes as it does single completions. The reward
functions read the final program from the episode's text, as under GRPO, and the episode's shaping (turn
and repeat costs) from the row's extra columns.

The feedback tokens must carry no gradient, but RLOO's completion mask is also its attention mask
(a zero there would hide the feedback from the next turn). RLOO sums each sequence's per-token
log-probabilities under that mask (its importance ratio, and its KL through the reference
model's), so the environment mask is applied to the per-token log-probabilities themselves: a
feedback token contributes exactly 0 to every sum and gets no gradient, on the pass that computes
the old log-probabilities and on the loss's pass alike (the mask rides in the batch as `env_mask`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from vprl.train.repair.trl_rollout import FINAL_STATUS_COLUMN, SHAPING_COLUMN, RepairRollout

ENV_MASK = "env_mask"


class RLOOEpisodesMixin:
    """Mixed in front of the RLOO trainer; set `repair_rollout` to train on episodes."""

    repair_rollout: RepairRollout | None = None
    _episode_prompts: list[Any] | None = None
    _env_rows: list[list[int]] | None = None  # this generation batch's environment masks, unpadded
    _env_mask: torch.Tensor | None = None  # the mask of the batch whose log-probabilities are computed

    def _generate(self, prompts):
        if self.repair_rollout is None:
            return super()._generate(prompts)
        self._episode_prompts = prompts
        try:
            return super()._generate(prompts)
        finally:
            self._episode_prompts = None

    def _generate_single_turn(self, prompt_ids, images=None, multimodal_fields=None, num_generations=None):
        if num_generations is None and self._episode_prompts is not None:
            return self._episodes(prompt_ids)
        if num_generations is None:
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields)
        # a turn of an episode (RepairRollout's call): n samples per group, or one per context
        with self._per_prompt(num_generations):
            ids = super()._generate_single_turn(prompt_ids, images, multimodal_fields or {})
        return ids, None  # RLOO keeps no sampling log-probabilities

    def _episodes(self, prompt_ids: list[list[int]]) -> list[list[int]]:
        prompts, self._episode_prompts = self._episode_prompts, None  # the turns' calls sample
        out = self.repair_rollout(prompts, self)
        if [list(p) for p in out["prompt_ids"]] != [list(p) for p in prompt_ids]:
            raise RuntimeError("the episodes' prompts are not the ones RLOO tokenized")
        self._env_rows = out[ENV_MASK]
        for row, shaping, status in zip(
            self._batch_inputs, out[SHAPING_COLUMN], out[FINAL_STATUS_COLUMN], strict=True
        ):
            row[SHAPING_COLUMN], row[FINAL_STATUS_COLUMN] = shaping, status  # the reward functions' columns
        return out["completion_ids"]

    @contextlib.contextmanager
    def _per_prompt(self, n: int) -> Iterator[None]:
        """RLOO's vLLM path draws `num_generations` samples per group of repeated prompts; a later
        turn's contexts are one per row."""
        saved = self.num_generations, self.num_generations_eval
        self.num_generations = self.num_generations_eval = n
        try:
            yield
        finally:
            self.num_generations, self.num_generations_eval = saved

    def _generate_and_score_completions(self, inputs):
        self._env_rows = None
        try:
            output = super()._generate_and_score_completions(inputs)
            if self._env_rows is not None:
                output[ENV_MASK] = _padded(self._env_rows, output["completion_ids"])
        finally:
            self._env_rows = None
        return output

    def _compute_loss(self, model, inputs):
        self._env_mask = inputs.get(ENV_MASK)
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._env_mask = None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        mask = self._env_mask
        if mask is None and self._env_rows is not None:  # the old (and reference) pass at generation
            mask = _padded(self._env_rows, logps)
        if mask is None:
            return logps, entropies, aux
        if mask.shape != logps.shape:
            raise RuntimeError(
                f"env_mask {tuple(mask.shape)} does not match the log-probabilities {tuple(logps.shape)}"
            )
        return logps * mask.to(logps.device, logps.dtype), entropies, aux


def _padded(rows: list[list[int]], like: torch.Tensor) -> torch.Tensor:
    """`rows` right-padded with zeros to `like`'s (batch, length): padding is masked out anyway."""
    out = torch.zeros(like.shape[0], like.shape[1], dtype=torch.long, device=like.device)
    if len(rows) != like.shape[0]:
        raise RuntimeError(f"{len(rows)} environment masks for {like.shape[0]} completions")
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row[: like.shape[1]], dtype=torch.long)
    return out
