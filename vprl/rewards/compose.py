"""Composition: weighted reward components, penalties by execution status, `infra_error` masked.

    total = sum(weight_i * component_i)       if the program ran (status "ok")
    total = penalty[status]                   if the program failed (syntax, runtime, timeout, ...)
    total = None                              if *we* failed (infra_error): the trainer masks it

A component that returns None for an item (it has nothing to say) contributes nothing, and its
weight is left out of the sum rather than counted as 0. When *every* component has nothing to say
about a program that ran (no unit test could be written for its query, say), the total is None
too: scoring it 0 would teach the policy that the program was wrong, when nobody judged it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from vprl.data.records import Example
from vprl.data.typed import check_row
from vprl.executor.results import PROGRAM_FAILURES, ExecutionResult
from vprl.rewards.protocol import RewardFn
from vprl.rewards.registry import build_reward

# ViUniT penalises compile and runtime errors separately; the values are theirs to tune, these are
# our defaults: a failed program scores below any answer, a syntax error below a runtime error.
DEFAULT_PENALTIES: dict[str, float] = {
    "syntax_error": -1.0,
    "runtime_error": -0.5,
    "bad_return": -0.5,
    "timeout": -0.5,
    "memory_limit": -0.5,
    "output_limit": -0.5,
    "rpc_limit": -0.5,
    "killed": -0.5,
}


@dataclass(frozen=True)
class RewardSpec:
    name: str
    weight: float = 1.0
    settings: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, row: dict[str, Any] | str, where: str = "reward") -> RewardSpec:
        if isinstance(row, str):
            return cls(row)
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a reward name or {{name, weight, settings}}, got {row!r:.60}")
        check_row(cls, {k: v for k, v in row.items() if v is not None}, where, required=("name",))
        return cls(row["name"], float(row.get("weight", 1.0)), dict(row.get("settings") or {}))


@dataclass(frozen=True)
class RewardConfig:
    rewards: tuple[RewardSpec, ...] = (RewardSpec("correctness"),)
    penalties: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_PENALTIES))

    def __post_init__(self) -> None:
        bad = set(self.penalties) - PROGRAM_FAILURES
        if bad:
            raise ValueError(
                f"penalties for unknown or unpenalisable statuses {sorted(bad)}; "
                f"valid: {sorted(PROGRAM_FAILURES)} (infra_error is always masked)"
            )

    def to_json(self) -> dict[str, Any]:
        return {"rewards": [asdict(r) for r in self.rewards], "penalties": dict(self.penalties)}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> RewardConfig:
        given = row.get("penalties") or {}
        if not isinstance(given, dict) or any(
            isinstance(v, bool) or not isinstance(v, int | float) for v in given.values()
        ):
            raise ValueError(f"penalties: expected a mapping of status to number, got {given!r:.80}")
        penalties = {**DEFAULT_PENALTIES, **{k: float(v) for k, v in given.items()}}
        rewards = row.get("rewards", ["correctness"])
        if not isinstance(rewards, list | tuple):
            raise ValueError(f"rewards: expected a list of rewards, got {rewards!r:.80}")
        specs = tuple(RewardSpec.from_json(r, f"rewards[{i}]") for i, r in enumerate(rewards))
        return cls(specs, penalties)


@dataclass(frozen=True)
class RewardBatch:
    totals: list[float | None]
    components: dict[str, list[float | None]]
    statuses: list[str]
    # reward name -> per result, the evidence rows of a `DetailedRewardFn` (empty where it did not
    # score the result); only rewards that give evidence have an entry.
    details: dict[str, list[list[dict[str, Any]]]] = field(default_factory=dict)

    def masked(self) -> list[bool]:
        return [t is None for t in self.totals]


class RewardComposer:
    """Builds each named reward once (at config time, so a bad name fails before any work) and
    scores batches of executed programs."""

    def __init__(self, config: RewardConfig, resources: Mapping[str, Any] | None = None):
        self.config = config
        self.functions: list[tuple[RewardSpec, RewardFn]] = [
            (s, build_reward(s.name, resources, **s.settings)) for s in config.rewards
        ]

    def __call__(
        self, examples: Sequence[Example], results: Sequence[ExecutionResult], programs: Sequence[str]
    ) -> RewardBatch:
        if not (len(examples) == len(results) == len(programs)):
            raise ValueError(f"got {len(examples)} examples, {len(results)} results, {len(programs)} programs")
        ok = [i for i, r in enumerate(results) if r.status == "ok"]
        components: dict[str, list[float | None]] = {}
        details: dict[str, list[list[dict[str, Any]]]] = {}
        for spec, fn in self.functions:
            values: list[float | None] = [None] * len(results)
            detailed = getattr(fn, "detailed", None)
            evidence: list[list[dict[str, Any]]] = [[] for _ in results]
            if ok:
                args = ([examples[i] for i in ok], [results[i] for i in ok], [programs[i] for i in ok])
                scored, shown = detailed(*args) if detailed is not None else (fn(*args), None)
                if len(scored) != len(ok):
                    raise ValueError(f"reward {spec.name!r} returned {len(scored)} values for {len(ok)} programs")
                if shown is not None and len(shown) != len(ok):
                    raise ValueError(f"reward {spec.name!r} returned {len(shown)} detail lists for {len(ok)} programs")
                for i, v in zip(ok, scored):
                    values[i] = v
                for i, rows in zip(ok, shown or ()):
                    evidence[i] = rows
            components[spec.name] = values
            if detailed is not None:
                details[spec.name] = evidence
        totals: list[float | None] = []
        for i, result in enumerate(results):
            if result.status == "infra_error":
                totals.append(None)
            elif result.status != "ok":
                totals.append(self.config.penalties.get(result.status, 0.0))
            else:
                parts = [(spec.weight, components[spec.name][i]) for spec, _ in self.functions]
                judged = [(w, v) for w, v in parts if v is not None]
                totals.append(sum(w * v for w, v in judged) if judged else None)
        return RewardBatch(totals, components, [r.status for r in results], details)
