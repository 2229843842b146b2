"""Gains with error bars: the change of a per-question score from one policy to another, over
several training seeds, with a 95 % interval that counts both sources of noise.

Each seed trains its own policy, which answers the same questions before and after training, so a
seed gives paired per-question differences. The interval comes from a two-level bootstrap: seeds
are drawn with replacement, then questions within each drawn seed; the statistic is the mean over
seeds of the mean difference. With one seed it is the paired bootstrap over questions alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vprl.data.records import Example
from vprl.rewards.correctness import correctness
from vprl.train.evaluation.metrics import Prediction

PREDICTION_FIELDS = ("example_id", "answer", "status", "program", "refused", "fallback_answer", "unit_test_score")


@dataclass(frozen=True)
class Gain:
    """Mean gain over seeds, its spread over seeds, and a 95 % interval (all in score units)."""

    mean: float
    std: float
    low: float
    high: float
    seeds: int
    questions: int

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)

    def text(self, scale: float = 100.0) -> str:
        return f"{scale * self.mean:+.1f} ± {scale * self.std:.1f} [{scale * self.low:+.1f}, {scale * self.high:+.1f}]"


def question_scores(
    predictions: Path | str,
    examples: Sequence[Example],
    policy: str,
    mode: str = "single",
    dataset: str | None = None,
    use_fallback: bool = False,
    answer_of: Callable[[dict[str, Any]], Any] | None = None,
) -> dict[str, float]:
    """Per-question correctness of one policy's answers in an evaluation's `predictions.jsonl`
    (the first seed it holds), for `examples` (of one VQA-style dataset). `answer_of` reads a
    prediction row's answer another way (default: the prediction's final answer)."""
    wanted = {e.id: e for e in examples}
    rows: dict[str, dict[str, Any]] = {}
    seed = None
    with open(predictions, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["policy"] != policy or row["mode"] != mode or row["example_id"] not in wanted:
                continue
            if dataset is not None and row["dataset"] != dataset:
                continue
            seed = row["seed"] if seed is None else seed
            if row["seed"] == seed:
                rows[row["example_id"]] = row
    missing = [i for i in wanted if i not in rows]
    if missing:
        raise ValueError(
            f"{predictions}: no {policy}/{mode} prediction for {len(missing)} example(s), e.g. {missing[:3]}"
        )
    if answer_of is None:

        def answer_of(row: dict[str, Any]) -> Any:
            return Prediction(**{k: row[k] for k in PREDICTION_FIELDS}).final_answer(use_fallback)

    out = {}
    for i, example in wanted.items():
        answer = answer_of(rows[i])
        out[i] = correctness(example, answer) if answer is not None else 0.0
    return out


def paired_gain(
    before: Sequence[dict[str, float]], after: Sequence[dict[str, float]], reps: int = 4000, seed: int = 0
) -> Gain:
    """The gain from `before[s]` to `after[s]` (per-question scores of seed s, same questions)."""
    diffs = [_diffs(b, a) for b, a in zip(before, after, strict=True)]
    if not diffs:
        raise ValueError("paired_gain: no seeds")
    per_seed = np.array([d.mean() for d in diffs])
    draws = _two_level(diffs, reps, np.random.default_rng(seed))
    low, high = np.quantile(draws, [0.025, 0.975])
    std = float(per_seed.std(ddof=1)) if len(per_seed) > 1 else 0.0
    return Gain(float(per_seed.mean()), std, float(low), float(high), len(diffs), len(diffs[0]))


def share_of_gain(
    reference: tuple[Sequence[dict[str, float]], Sequence[dict[str, float]]],
    other: tuple[Sequence[dict[str, float]], Sequence[dict[str, float]]],
    reps: int = 4000,
    seed: int = 0,
) -> Gain:
    """`other`'s gain as a share of `reference`'s, on the same seeds and questions (both pairs are
    (before, after) lists per seed); the interval resamples both together."""
    ref = [_diffs(b, a) for b, a in zip(*reference, strict=True)]
    oth = [_diffs(b, a) for b, a in zip(*other, strict=True)]
    if len(ref) != len(oth) or any(len(r) != len(o) for r, o in zip(ref, oth)):
        raise ValueError("share_of_gain: the two gains must cover the same seeds and questions")
    rng = np.random.default_rng(seed)
    ratios = []
    for _ in range(reps):
        seeds = rng.integers(0, len(ref), len(ref))
        num = den = 0.0
        for s in seeds:
            q = rng.integers(0, len(ref[s]), len(ref[s]))
            num += oth[s][q].mean()
            den += ref[s][q].mean()
        ratios.append(num / den if den else np.nan)
    per_seed = np.array([o.mean() / r.mean() if r.mean() else np.nan for r, o in zip(ref, oth)])
    mean = float(np.mean([o.mean() for o in oth]) / np.mean([r.mean() for r in ref]))
    low, high = np.nanquantile(ratios, [0.025, 0.975])
    std = float(np.nanstd(per_seed, ddof=1)) if len(per_seed) > 1 else 0.0
    return Gain(mean, std, float(low), float(high), len(ref), len(ref[0]))


def _diffs(before: dict[str, float], after: dict[str, float]) -> np.ndarray:
    if set(before) != set(after):
        raise ValueError("paired scores must cover the same questions")
    ids = sorted(before)
    return np.array([after[i] - before[i] for i in ids], dtype=float)


def _two_level(diffs: list[np.ndarray], reps: int, rng: np.random.Generator) -> np.ndarray:
    out = np.empty(reps)
    for r in range(reps):
        seeds = rng.integers(0, len(diffs), len(diffs)) if len(diffs) > 1 else [0]
        out[r] = np.mean([diffs[s][rng.integers(0, len(diffs[s]), len(diffs[s]))].mean() for s in seeds])
    return out
