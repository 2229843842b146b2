"""Rewards that need no models: supervised correctness and "the program ran"."""

from __future__ import annotations

from collections.abc import Sequence

from vprl.data.records import Example
from vprl.executor.results import ExecutionResult
from vprl.rewards.correctness import correctness, grounding_scores
from vprl.rewards.protocol import RewardFn


def correctness_reward(iou_threshold: float | None = None) -> RewardFn:
    """Dataset-aware correctness against the labels (VQA soft accuracy, exact match, yes/no, IoU).

    With `iou_threshold`, grounding scores 1 at or above it and 0 below (REC accuracy) instead of
    the continuous IoU.
    """

    def score(
        examples: Sequence[Example], results: Sequence[ExecutionResult], programs: Sequence[str]
    ) -> list[float | None]:
        out: list[float | None] = []
        for example, result in zip(examples, results, strict=True):
            if example.task == "grounding" and iou_threshold is not None:
                out.append(float(grounding_scores(example, result.answer)["iou"] >= iou_threshold))
            else:
                out.append(correctness(example, result.answer))
        return out

    return score


def executes_reward() -> RewardFn:
    """1 for every program that ran to an answer: a shaping term, never a reward on its own."""

    def score(
        examples: Sequence[Example], results: Sequence[ExecutionResult], programs: Sequence[str]
    ) -> list[float | None]:
        return [1.0 if r.answer is not None else 0.0 for r in results]

    return score
