"""ViUniT's unit-test sampler (Algorithm 1): cover every expected answer first, then the inputs.

Answer phase: one test per distinct answer (the first written, so the choice is deterministic),
truncated at k when there are more answers than k. Input phase: greedy farthest-point selection
(max over candidates of the min distance to the chosen set) in an embedding space of captions.
The embedding is pluggable; the default is a local hashing embedder so it works with no model.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from vprl.rewards.unit_tests.parsing import UnitTest

Embedder = Callable[[Sequence[str]], np.ndarray]


def hashing_embedder(dim: int = 256) -> Embedder:
    """Bag of words and character trigrams hashed into `dim` buckets, L2-normalised."""

    def embed(texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), dim), dtype=np.float64)
        for row, text in enumerate(texts):
            words = re.findall(r"[a-z0-9]+", text.lower())
            grams = words + [w[i : i + 3] for w in words for i in range(max(len(w) - 2, 1))]
            for g in grams:
                out[row, int(hashlib.md5(g.encode()).hexdigest()[:8], 16) % dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1.0, norms)

    return embed


def sample_tests(
    tests: Sequence[UnitTest],
    k: int,
    embed: Embedder | None = None,
    use_answers: bool = True,
    seed: int = 0,
    balance: bool = False,
) -> list[UnitTest]:
    """Pick at most k tests: answer coverage (if `use_answers`), then farthest-first by caption.
    With `balance`, each later pick is the farthest among the candidates whose answer is the least
    represented so far, so the expected answers stay as even as the candidates allow: a program that
    always gives the same answer then passes about 1/(number of answers) of the tests, not whatever
    share of the candidates happened to expect that answer."""
    pool = list(tests)
    if k <= 0 or not pool:
        return []
    if len(pool) <= k:
        return pool
    chosen: list[int] = []
    if use_answers:
        seen: set[str] = set()
        for i, t in enumerate(pool):
            if t.answer not in seen and len(chosen) < k:
                seen.add(t.answer)
                chosen.append(i)
    else:
        chosen.append(random.Random(seed).randrange(len(pool)))
    vectors = (embed or hashing_embedder())([t.caption for t in pool])
    remaining = [i for i in range(len(pool)) if i not in chosen]
    while len(chosen) < k and remaining:
        eligible = remaining
        if balance:
            counts = Counter(pool[i].answer for i in chosen)
            fewest = min(counts[pool[i].answer] for i in remaining)
            eligible = [i for i in remaining if counts[pool[i].answer] == fewest]
        dists = np.linalg.norm(vectors[eligible][:, None, :] - vectors[chosen][None, :, :], axis=-1).min(axis=1)
        best = eligible[int(np.argmax(dists))]  # ties go to the earliest-written test
        chosen.append(best)
        remaining.remove(best)
    return [pool[i] for i in chosen]


def random_tests(tests: Sequence[UnitTest], k: int, seed: int = 0) -> list[UnitTest]:
    """The random baseline sampler."""
    pool = list(tests)
    return random.Random(seed).sample(pool, min(k, len(pool))) if pool and k > 0 else []


def coverage(tests: Sequence[UnitTest]) -> float:
    """Share of distinct answers among the tests (1.0 = every test checks a different answer)."""
    return len({t.answer for t in tests}) / len(tests) if tests else math.nan
