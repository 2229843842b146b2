"""The run's reward, built in one place (open-r1's `get_reward_funcs`): the reward config's names,
weights and settings, and, for a dataset mixture, each reward's scope, so that a reward scores only
the examples of the entries it is named for.

Every trainer (GRPO, RLOO, ReST) and every entry that scores programs (the trl and verl entries,
the benches) builds its composer here, so a recipe's scopes cannot be applied by one path and
forgotten by another: a label-reading reward outside its scope would raise on a label-free example.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vprl.data.records import Example
from vprl.rewards.compose import RewardComposer, RewardConfig


def build_rewards(
    config: RewardConfig,
    resources: Mapping[str, Any] | None = None,
    scopes: Mapping[str, frozenset[str]] | None = None,
    owner: Callable[[Example], str | None] | None = None,
) -> RewardComposer:
    """The composer of `config`'s rewards. With `scopes` (reward name -> the groups it scores) and
    `owner` (an example's group, e.g. its mixture entry), a reward says nothing (None) about the
    examples of other groups, so the composer leaves its weight out of their totals."""
    composer = RewardComposer(config, resources=resources)
    if not scopes:
        return composer
    if owner is None:
        raise ValueError("scoped rewards need `owner`, the function naming an example's group")
    missing = [spec.name for spec in config.rewards if spec.name not in scopes]
    if missing:
        raise ValueError(f"rewards {missing} have no scope; scopes name {sorted(scopes)}")
    composer.functions = [
        (spec, _Scoped(fn, spec.name, frozenset(scopes[spec.name]), owner)) for spec, fn in composer.functions
    ]
    return composer


class _Scoped:
    """A reward that scores only its groups' examples; `detailed` is offered when the reward has it,
    so a scoped reward still shows its evidence."""

    def __init__(self, fn: Any, name: str, groups: frozenset[str], owner: Callable[[Example], str | None]):
        self.fn, self.name, self.groups, self.owner = fn, name, groups, owner
        if getattr(fn, "detailed", None) is not None:
            self.detailed = self._detailed

    def _mine(self, examples: Sequence[Example]) -> list[int]:
        owners = [self.owner(ex) for ex in examples]
        stray = [ex.id for ex, o in zip(examples, owners, strict=True) if o is None]
        if stray:
            raise ValueError(f"reward {self.name!r} is scoped to mixture entries, but {stray[:3]} belong to none")
        return [i for i, o in enumerate(owners) if o in self.groups]

    def __call__(
        self, examples: Sequence[Example], results: Sequence[Any], programs: Sequence[str]
    ) -> list[float | None]:
        values, _ = self._score(self.fn, examples, results, programs, detailed=False)
        return values

    def _detailed(
        self, examples: Sequence[Example], results: Sequence[Any], programs: Sequence[str]
    ) -> tuple[list[float | None], list[list[dict[str, Any]]]]:
        return self._score(self.fn.detailed, examples, results, programs, detailed=True)

    def _score(self, fn: Any, examples, results, programs, detailed: bool):
        mine = self._mine(examples)
        values: list[float | None] = [None] * len(examples)
        shown: list[list[dict[str, Any]]] = [[] for _ in examples]
        if mine:
            args = ([examples[i] for i in mine], [results[i] for i in mine], [programs[i] for i in mine])
            scored, evidence = fn(*args) if detailed else (fn(*args), None)
            if len(scored) != len(mine):
                raise ValueError(f"reward {self.name!r} returned {len(scored)} values for {len(mine)} programs")
            for i, v in zip(mine, scored, strict=True):
                values[i] = v
            for i, rows in zip(mine, evidence or (), strict=False):
                shown[i] = rows
        return values, shown
