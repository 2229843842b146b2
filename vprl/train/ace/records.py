"""Automatically generated in-context examples (ACEs): the mined example with its provenance, the
report of a mining, and the two steps every source shares: one program per normalised AST and
query, then a diverse pick (docs/references.md, Stanić et al. and ViUniT's sampler)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vprl.executor.program import program_key
from vprl.rewards.unit_tests.sampler import hashing_embedder
from vprl.train.prompts import IncontextExample
from vprl.train.rollouts.log import RolloutRow


class AceError(ValueError):
    pass


@dataclass(frozen=True)
class Ace:
    """One mined example with where it came from. `step` is the training step (from-run) or the
    trial that produced it (stanic, 0 = the zero-shot attempt)."""

    query: str
    program: str
    example_id: str
    score: float
    components: dict[str, float | None] = field(default_factory=dict)
    step: int | None = None
    group: str = ""
    answer: Any = None
    dataset: str = ""
    task: str = ""
    policy: str = ""
    prompt_hash: str = ""
    program_key: str = ""
    tool_stack: Any = None
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_example(self) -> IncontextExample:
        row = self.to_json()
        return IncontextExample(row.pop("query"), row.pop("program"), extra=row)

    @classmethod
    def from_row(cls, row: RolloutRow, program: str, source: str, policy: str = "", tool_stack: Any = None) -> Ace:
        return cls(
            query=row.query.strip(),
            program=program,
            example_id=row.example_id,
            score=float(row.total),
            components=dict(row.components),
            step=row.step,
            group=row.group,
            answer=row.answer,
            dataset=row.dataset,
            task=row.task,
            policy=row.policy or policy,
            prompt_hash=row.prompt_hash,
            program_key=program_key(program),
            tool_stack=tool_stack,
            source=source,
        )


@dataclass
class AceReport:
    """The picked ACEs and what the picking saw (for the preview and the CLI's messages)."""

    aces: list[Ace]
    k: int
    method: str
    source: str
    counts: dict[str, int]
    families_present: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def families_covered(self) -> list[str]:
        return sorted({a.group for a in self.aces if a.group})

    @property
    def shortfall(self) -> str | None:
        if len(self.aces) >= self.k:
            return None
        return (
            f"asked for {self.k} ACEs but only {len(self.aces)} distinct programs earned a good enough score "
            f"({self.counts.get('good', 0)} good programs over {self.counts.get('examples', 0)} examples); "
            f"wrote {len(self.aces)}"
        )


def _norm_query(query: str) -> str:
    return " ".join(query.casefold().split())


def _answer_key(answer: Any) -> str | None:
    """Answers that name a category (strings, yes/no, counts) take part in answer coverage; boxes do not."""
    if isinstance(answer, bool):
        return "yes" if answer else "no"
    if isinstance(answer, (str, int, float)):
        return _norm_query(str(answer))
    return None


def distinct(aces: Sequence[Ace]) -> list[Ace]:
    """The first of each normalised AST and of each query, in the given (best-first) order."""
    keys: set[str] = set()
    queries: set[str] = set()
    out = []
    for ace in aces:
        if ace.program_key in keys or _norm_query(ace.query) in queries:
            continue
        keys.add(ace.program_key)
        queries.add(_norm_query(ace.query))
        out.append(ace)
    return out


def select_diverse(pool: Sequence[Ace], k: int, embed: Callable[[Sequence[str]], Any] | None = None) -> list[Ace]:
    """k of `pool` (best first): one per family (largest families first), then one per unseen
    answer, then farthest-first by embedding of query + program (ViUniT's sampler, Alg. 1)."""
    import numpy as np

    if k <= 0 or not pool:
        return []
    chosen: list[int] = []
    families: dict[str, list[int]] = {}
    for i, ace in enumerate(pool):
        families.setdefault(ace.group, []).append(i)
    for family in sorted(families, key=lambda f: (-len(families[f]), f)):
        if len(chosen) < k:
            chosen.append(families[family][0])
    seen = {_answer_key(pool[i].answer) for i in chosen}
    for i, ace in enumerate(pool):
        key = _answer_key(ace.answer)
        if len(chosen) < k and i not in chosen and key is not None and key not in seen:
            seen.add(key)
            chosen.append(i)
    remaining = [i for i in range(len(pool)) if i not in chosen]
    if len(chosen) < k and remaining:
        vectors = (embed or hashing_embedder())([f"{a.query}\n{a.program}" for a in pool])
        while len(chosen) < k and remaining:
            dists = np.linalg.norm(vectors[remaining][:, None, :] - vectors[chosen][None, :, :], axis=-1).min(axis=1)
            chosen.append(remaining.pop(int(np.argmax(dists))))  # ties go to the better-ranked program
    return [pool[i] for i in chosen]
