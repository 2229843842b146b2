"""A heavier SFT loss on the shape and colour words of the target programs (`--noun_weight W`).

Why: a tiny policy learns to copy its question's nouns into its program, or does not, and which
one follows the draw of its initial weights (`noun_copy.py`). The noun tokens are a few per cent of
a program's tokens, so the gradient that would teach the copy is small beside the rest of the
program's; a policy that has not found the copy early names a shape at random and stays there.
Weighting those tokens W times in the cross-entropy makes the copy a larger share of what SFT
fits. Every shape or colour word of a target program is one of its question's (the world's gold
programs name objects in the question's words, and no mutation of `vprl.data.shapes.mutations`
brings in a noun the program did not have), so the weighted tokens are copies.

The loss is trl's own `compute_loss_func` hook: trl runs the forward and passes the logits and
labels; this sums the weighted per-token cross-entropy over the completion tokens and divides by
their count, as the unweighted loss does, so W = 1 gives trl's loss.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from vprl.data.shapes.scene import COLORS, SHAPES

IGNORE = -100  # the label of a prompt or padding position


def noun_token_ids(tokenizer, completions: Iterable[str]) -> list[int]:
    """The ids of the world's shape words (singular and plural) and colour words that the target
    programs name; each must be a single token (a word split into pieces would be weighted in part,
    or not at all)."""
    text = "\n".join(completions)
    forms = [*SHAPES, *(f"{s}s" for s in SHAPES), *COLORS]
    named = [w for w in forms if re.search(rf"\b{w}\b", text)]
    vocabulary = tokenizer.get_vocab()
    split = [w for w in named if w not in vocabulary]
    if split:
        raise ValueError(
            f"noun_weight: the tokenizer has no single token for {', '.join(split)}, which the programs name; "
            "train it with a larger vocab_size or leave noun_weight at 1"
        )
    return [vocabulary[w] for w in named]


def noun_weighted_loss(tokenizer, weight: float, completions: Iterable[str]) -> Callable:
    """trl's `compute_loss_func`: cross-entropy with the terms of the noun tokens that the target
    `completions` name multiplied by `weight`."""
    import torch
    import torch.nn.functional as F

    if weight <= 0:
        raise ValueError(f"noun_weight must be > 0, got {weight}")
    ids = torch.tensor(noun_token_ids(tokenizer, completions), dtype=torch.long)

    def loss(outputs, labels, num_items_in_batch=None):
        logits = outputs.logits[:, :-1].float()
        target = labels[:, 1:]
        kept = target != IGNORE
        safe = target.masked_fill(~kept, 0)
        per_token = F.cross_entropy(logits.flatten(0, 1), safe.flatten(), reduction="none").view_as(target)
        weights = torch.where(torch.isin(safe, ids.to(safe.device)), weight, 1.0) * kept
        count = kept.sum() if num_items_in_batch is None else num_items_in_batch
        return (per_token * weights).sum() / torch.as_tensor(count, device=per_token.device).clamp(min=1)

    return loss
