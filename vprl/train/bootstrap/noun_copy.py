"""Does the policy copy its question's shape and colour into its program? Teacher-forced on the
gold program: at the first shape (or colour) named to `find` or `exists`, the probability the
policy gives the question's own word among the world's shapes (or colours), and how often that
word is the likeliest.

A tiny policy fits its few hundred training questions either by copying each question's words or
by recalling what each question's program was, and which one a bootstrap learns differs between
draws of its initial weights. The shape figure is bimodal, near 0.9 where the policy copies and
near chance (0.2 for five shapes) where it does not; the colour figure (chance 0.125) spreads more.
A policy that copies neither looks for objects its question never mentions, and after feedback for
others (docs/repair.md, "Which policies copy their nouns").
"""

from __future__ import annotations

import re
from typing import Any

from vprl.data.records import Example
from vprl.data.shapes.scene import COLORS, SHAPES
from vprl.train.bootstrap.pairs import body
from vprl.train.prompts import PromptConfig, PromptTemplate

# The word of a `find`/`exists` phrase read for each kind: modifiers may come before it, a shape
# may take a plural "s".
WORDS = {"shape": SHAPES, "colour": COLORS}
_FIRST = {
    "shape": re.compile(r'\b(?:find|exists)\("(?:\w+ )*?(' + "|".join(SHAPES) + r')s?"'),
    "colour": re.compile(r'\b(?:find|exists)\("(?:\w+ )*?(' + "|".join(COLORS) + r")\b"),
}


def noun_copy(model, tokenizer, examples: list[Example], gold: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Per kind (`shape`, `colour`), the figure over the distinct questions of `examples` whose gold
    program names one: `questions`, `p_right` (the mean probability of the question's word given
    that the policy writes a word of that kind there) and `argmax_right` (the share where it is the
    likeliest)."""
    import torch

    template = PromptTemplate.from_config(PromptConfig(layout="bare", task="vqa"))
    vocabulary = tokenizer.get_vocab()
    out: dict[str, dict[str, Any]] = {}
    was_training = model.training
    model.eval()
    try:
        for kind, words in WORDS.items():
            split = [w for w in words if w not in vocabulary]
            if split:  # a vocabulary too small to hold every word whole (a test's): nothing to read
                out[kind] = {"questions": 0, "p_right": None, "argmax_right": None}
                out[kind]["skipped"] = f"not one token: {', '.join(split)}"
                continue
            ids = [vocabulary[w] for w in words]
            p_right: list[float] = []
            top: list[bool] = []
            for query in dict.fromkeys(e.query for e in examples):
                program = body(gold[query])
                match = _FIRST[kind].search(program)
                if not match:
                    continue
                prefix = template.build(query) + program[: match.start(1)]
                with torch.no_grad():
                    logits = model(**tokenizer(prefix, return_tensors="pt")).logits[0, -1]
                probs = torch.softmax(logits.float(), -1)[ids]
                right = words.index(match.group(1))
                p_right.append(float(probs[right] / probs.sum()))
                top.append(int(probs.argmax()) == right)
            n = len(p_right)
            out[kind] = {
                "questions": n,
                "p_right": round(sum(p_right) / n, 4) if n else None,
                "argmax_right": round(sum(top) / n, 4) if n else None,
            }
    finally:
        model.train(was_training)
    return out
