"""Relabelled pairs: a share of the mixture's pairs with the world's shape and colour words
permuted, one permutation per pair, in its question and its program alike.

Why: the tiny policy, trained on a few hundred distinct questions, can fit them by recalling each
question's program rather than by copying the question's nouns into it, and some seeds do. Sampled,
such a policy names an object its question never mentions (`find("star")` for "Is the square
blue?"), and after feedback it names another one: the slip that caps the miniature's repair rate
(docs/repair.md, "Which seeds copy their nouns"). A relabelled pair is still a right pair, of the
question the permutation makes (the world's programs name its objects in the question's own
words), and a question whose nouns change from one pair to the next can only be fitted by copying
them. Only the text changes; nothing is run.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from vprl.data.shapes.scene import COLORS, SHAPES
from vprl.train.bootstrap.pairs import SFTPair

_WORDS = {"shape": SHAPES, "colour": COLORS}
# A shape's plural is its word and "s" ("circles"); word boundaries keep "start" and "predicate" out.
_PATTERN = re.compile(r"\b(" + "|".join(SHAPES + COLORS) + r")(s?)\b")


def permutation(rng: np.random.Generator) -> dict[str, str]:
    """A random permutation of the shapes among themselves and of the colours among themselves."""
    out: dict[str, str] = {}
    for words in _WORDS.values():
        out.update(zip(words, (words[int(i)] for i in rng.permutation(len(words))), strict=True))
    return out


def relabel_text(text: str, mapping: dict[str, str]) -> str:
    """`text` with every shape and colour word replaced by its image under `mapping` (all at once)."""
    return _PATTERN.sub(lambda m: mapping[m.group(1)] + m.group(2), text)


def relabel_pairs(pairs: list[SFTPair], share: float, rng: np.random.Generator) -> tuple[list[SFTPair], int]:
    """`pairs` with a `share` of them, drawn by `rng`, relabelled in place of the originals (the
    mixture keeps its size, its order and its kinds); and how many were."""
    if not 0 <= share <= 1:
        raise ValueError(f"relabel share must be in [0, 1], got {share}")
    out: list[SFTPair] = []
    n = 0
    for pair in pairs:
        if rng.random() < share:
            mapping = permutation(rng)
            pair = replace(
                pair, prompt=relabel_text(pair.prompt, mapping), completion=relabel_text(pair.completion, mapping)
            )
            n += 1
        out.append(pair)
    return out, n
