"""Semantic opposites for ExoViP's negative sampling ([E] §3.2, E.4; docs/references.md#exovip-verifiers).

A candidate answer is scored *relative to* a semantic opposite: `s = s(answer) - s(opposite)`.
ExoViP chooses the opposite with CLIP text embeddings, either the least similar word (§3.2) or a
random word among those with similarity < 0.5 (E.4); both strategies are here (`argmin`,
`random_below`). The source vocabulary is unspecified in the paper (a gap); ours is grouped by
kind (colours, shapes, sizes, positions, yes/no, numbers, plus whatever the caller adds, e.g. the
dataset's answers). The opposite is searched within the answer's own group, so "red" gets another
colour rather than a shape, and two-word groups give antonyms (yes -> no, left -> right, top ->
bottom). A word in no group is searched against the whole vocabulary, as ExoViP does.

The embedder is pluggable (`vprl.rewards.verifiers.embedders`): a local hashing embedder by default,
a sentence encoder or CLIP's text encoder on GPU.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from vprl.data.shapes.scene import SHAPES, SIZES
from vprl.executor.tools.vocabulary import COLORS, MATERIALS
from vprl.rewards.unit_tests.sampler import Embedder, hashing_embedder

STRATEGIES = ("argmin", "random_below")

# The shapes world's words plus the general attribute words GQA-style questions ask about.
DEFAULT_GROUPS: dict[str, tuple[str, ...]] = {
    "yes_no": ("yes", "no"),
    "color": COLORS,
    "shape": SHAPES,
    "size": SIZES,
    "horizontal": ("left", "right"),
    "vertical": ("top", "bottom"),
    "above_below": ("above", "below"),
    "material": MATERIALS,
    "number": ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10"),
}


@dataclass(frozen=True)
class OppositeConfig:
    strategy: str = "argmin"
    threshold: float = 0.5  # `random_below`: candidates less similar than this (ExoViP E.4)
    seed: int = 0
    extra_groups: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"opposites.strategy must be one of {STRATEGIES}, got {self.strategy!r}")


class OppositeSampler:
    """`opposite(word)` -> the semantic opposite of `word` from the vocabulary, or None."""

    def __init__(
        self,
        groups: Mapping[str, Sequence[str]] | None = None,
        embedder: Embedder | None = None,
        config: OppositeConfig | None = None,
    ) -> None:
        self.config = config or OppositeConfig()
        merged: dict[str, list[str]] = {k: list(v) for k, v in (groups or DEFAULT_GROUPS).items()}
        for name, extra in self.config.extra_groups.items():
            merged.setdefault(name, [])
            merged[name].extend(w for w in extra if w not in merged[name])
        self.groups = {k: [_norm(w) for w in v] for k, v in merged.items() if v}
        self.embed = embedder or hashing_embedder()
        self.vocabulary = sorted({w for words in self.groups.values() for w in words})
        self._vectors: dict[str, np.ndarray] = {}
        self._memo: dict[str, str | None] = {}

    def group_of(self, word: str) -> str | None:
        word = _norm(word)
        return next((name for name, words in self.groups.items() if word in words), None)

    def knows(self, word: str) -> bool:
        return self.group_of(word) is not None

    def opposite(self, word: str) -> str | None:
        word = _norm(word)
        if word not in self._memo:
            self._memo[word] = self._choose(word)
        return self._memo[word]

    def _choose(self, word: str) -> str | None:
        group = self.group_of(word)
        pool = [w for w in (self.groups[group] if group else self.vocabulary) if w != word]
        if not pool:
            return None
        if len(pool) == 1:
            return pool[0]
        sims = self._similarities(word, pool)
        if self.config.strategy == "random_below":
            below = [w for w, s in zip(pool, sims) if s < self.config.threshold]
            if below:
                # Seeded by the word so a word keeps its opposite across calls and processes.
                return random.Random(f"{self.config.seed}:{word}").choice(sorted(below))
        return pool[int(np.argmin(sims))]  # ties go to the earliest word of the group

    def _similarities(self, word: str, pool: Sequence[str]) -> np.ndarray:
        missing = [w for w in [word, *pool] if w not in self._vectors]
        if missing:
            for w, v in zip(missing, np.asarray(self.embed(missing), dtype=np.float64)):
                norm = np.linalg.norm(v)
                self._vectors[w] = v / norm if norm > 0 else v
        target = self._vectors[word]
        return np.array([float(target @ self._vectors[w]) for w in pool])


def answer_groups(answers: Iterable[str]) -> dict[str, list[str]]:
    """The dataset's answer vocabulary as an extra group (ExoViP's unspecified source; our proposal)."""
    return {"answers": sorted({_norm(a) for a in answers if a and len(a.split()) <= 3})}


def _norm(word: str) -> str:
    return " ".join(str(word).lower().split())
