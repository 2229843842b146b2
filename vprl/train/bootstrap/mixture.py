"""The bootstrap's mixture: each training question's bare prompt paired with its gold program or a
plausible wrong one, so that the tiny policy starts imperfect the way real code LLMs do (strong
families mostly gold, weak ones mostly their dominant mistake; `fit.py` says why)."""

from __future__ import annotations

from typing import Any

import numpy as np

from vprl.data.records import Example
from vprl.data.shapes.mutations import mutate
from vprl.train.bootstrap.pairs import SFTPair, body
from vprl.train.prompts import PromptConfig, PromptTemplate

# Mistakes a weak family is dominated by, in order of preference: the ones that change the answer
# most often on the oracle (tests/test_mutations.py prints the rates); `index_swap` is not here
# because `[-1]` of a unique phrase's one-element list is `[0]`.
DOMINANT_MISTAKES = (
    "invert_answer",
    "swap_side",
    "wrong_attribute",
    "flip_comparison",
    "swap_extreme",
    "swap_logic",
    "unchecked_empty",
    "first_option",
    "drop_modifier",
    "repeated_noun",
    "swap_axis",
)


def plan_mixture(
    examples: list[Example],
    gold: dict[str, str],
    cfg: Any,  # BootstrapConfig: weak_share, gold_strong, gold_weak, dominant, copies
    rng: np.random.Generator,
    family_of: Any = None,
    all_weak: bool = False,
) -> tuple[list[SFTPair], dict[str, dict[str, Any]]]:
    """SFT pairs for `examples` and, per family, what was drawn (weak?, dominant mistake, counts).
    Families are `Example.group` unless `family_of(example)` says; with `all_weak` every family
    with a dominant mistake is weak instead of a `weak_share` of them."""
    templates = {
        task: PromptTemplate.from_config(PromptConfig(layout="bare", task=task)) for task in {e.task for e in examples}
    }
    by_family: dict[str, list[Example]] = {}
    for ex in examples:
        by_family.setdefault(family_of(ex) if family_of else ex.group or "", []).append(ex)
    mutants = {ex.id: {m.kind: m.program for m in mutate(gold[ex.query])} for ex in examples}
    dominant: dict[str, str | None] = {}
    for family, exs in sorted(by_family.items()):
        share = {k: sum(k in mutants[e.id] for e in exs) / len(exs) for k in DOMINANT_MISTAKES}
        dominant[family] = next((k for k in DOMINANT_MISTAKES if share[k] >= 0.5), None)
    candidates = sorted(f for f, k in dominant.items() if k is not None)
    n_weak = len(candidates) if all_weak else min(len(candidates), int(round(cfg.weak_share * len(by_family))))
    weak = {candidates[int(i)] for i in rng.permutation(len(candidates))[:n_weak]}
    pairs: list[SFTPair] = []
    plan: dict[str, dict[str, Any]] = {}
    for family, exs in sorted(by_family.items()):
        is_weak = family in weak
        p_gold = cfg.gold_weak if is_weak else cfg.gold_strong
        counts: dict[str, int] = {}
        for ex in exs:
            for _ in range(cfg.copies):
                options = mutants[ex.id]
                kind = "gold"
                if options and rng.random() >= p_gold:
                    if is_weak and dominant[family] in options and rng.random() < cfg.dominant:
                        kind = dominant[family]
                    else:
                        others = sorted(k for k in options if not (is_weak and k == dominant[family])) or sorted(
                            options
                        )
                        kind = others[int(rng.integers(len(others)))]
                program = gold[ex.query] if kind == "gold" else options[kind]
                pairs.append(SFTPair(ex.id, family, kind, templates[ex.task].build(ex.query), body(program)))
                counts[kind] = counts.get(kind, 0) + 1
        plan[family] = {
            "weak": is_weak,
            "p_gold": p_gold,
            "dominant": dominant[family] if is_weak else None,
            "questions": len(exs),
            "targets": dict(sorted(counts.items())),
        }
    order = rng.permutation(len(pairs))
    return [pairs[int(i)] for i in order], plan
