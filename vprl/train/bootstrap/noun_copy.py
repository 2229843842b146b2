"""Does the policy copy its question's shape into its program? Teacher-forced on the gold program:
at the first shape named to `find` or `exists`, the probability the policy gives the question's
own shape among the world's shapes, and how often that shape is the likeliest.

A tiny policy fits its few hundred training questions either by copying each question's nouns or
by recalling what each question's program was; which one a bootstrap learns differs between seeds,
and the figure is bimodal: near 0.9 where it copies, near chance (0.2 for five shapes) where it
does not. A policy that does not copy names objects its question never mentions, and after
feedback names another one (docs/repair.md, "Which policies copy their nouns").
"""

from __future__ import annotations

import re
from typing import Any

from vprl.data.records import Example
from vprl.data.shapes.scene import SHAPES
from vprl.train.bootstrap.pairs import body
from vprl.train.prompts import PromptConfig, PromptTemplate

# The shape word of a `find`/`exists` phrase, its modifiers before it and a plural "s" after.
_NOUN = re.compile(r'\b(?:find|exists)\("(?:\w+ )*?(' + "|".join(SHAPES) + r')s?"')


def noun_copy(model, tokenizer, examples: list[Example], gold: dict[str, str]) -> dict[str, Any]:
    """The figure over the distinct questions of `examples` whose gold program names a shape:
    `questions`, `p_right` (the mean probability of the question's shape given that the policy
    writes a shape there) and `argmax_right` (the share where it is the likeliest shape)."""
    import torch

    template = PromptTemplate.from_config(PromptConfig(layout="bare", task="vqa"))
    vocabulary = tokenizer.get_vocab()
    split = [s for s in SHAPES if s not in vocabulary]
    if split:  # a vocabulary too small to hold every shape whole (a test's): nothing to read
        return {"questions": 0, "p_right": None, "argmax_right": None, "skipped": f"not one token: {', '.join(split)}"}
    ids = [vocabulary[s] for s in SHAPES]
    p_right: list[float] = []
    top: list[bool] = []
    was_training = model.training
    model.eval()
    try:
        for query in dict.fromkeys(e.query for e in examples):
            program = body(gold[query])
            match = _NOUN.search(program)
            if not match:
                continue
            prefix = template.build(query) + program[: match.start(1)]
            with torch.no_grad():
                logits = model(**tokenizer(prefix, return_tensors="pt")).logits[0, -1]
            shapes = torch.softmax(logits.float(), -1)[ids]
            right = SHAPES.index(match.group(1))
            p_right.append(float(shapes[right] / shapes.sum()))
            top.append(int(shapes.argmax()) == right)
    finally:
        model.train(was_training)
    n = len(p_right)
    return {
        "questions": n,
        "p_right": round(sum(p_right) / n, 4) if n else None,
        "argmax_right": round(sum(top) / n, 4) if n else None,
    }
