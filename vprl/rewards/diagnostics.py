"""Reward-hacking diagnostics, logged next to the rewards every step.

- trivial share: programs that only hand the question to `simple_query` (end-to-end VQA in
  disguise; they can score well without composing anything);
- constant-answer share: how much of the batch gives the single most common answer.

Groups without a learning signal are `vprl.rewards.groups`; the trainer logs their share.
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from vprl.executor.program import parse_program

# Calls that do not add any composition on top of a single VQA query.
_PASSIVE_CALLS = frozenset({"ImagePatch", "simple_query", "bool_to_yesno", "str", "lower", "strip"})


def is_trivial(program: str) -> bool:
    """True if the program's only perception is `simple_query` (and it calls it at most once)."""
    try:
        tree = parse_program(program)
    except (SyntaxError, ValueError, RecursionError):
        return False
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            names.append(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names.count("simple_query") == 1 and set(names) <= _PASSIVE_CALLS


def diagnostics(programs: Sequence[str], answers: Sequence[Any]) -> dict[str, float]:
    """Shares in [0, 1] for a batch."""
    n = len(programs)
    if n == 0:
        return {"trivial_share": 0.0, "constant_answer_share": 0.0}
    trivial = sum(is_trivial(p) for p in programs) / n
    keys = [json.dumps(a, sort_keys=True) for a in answers if a is not None]
    constant = Counter(keys).most_common(1)[0][1] / n if keys else 0.0
    return {"trivial_share": trivial, "constant_answer_share": constant}
