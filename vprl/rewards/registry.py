"""The reward registry: reward functions by name, so recipes pick them in YAML (`vprl.rewards.protocol`
says what a reward function is).

Functions that need set-up (models, caches) are factories: a function taking keyword settings and
returning the reward function. Settings come from the YAML recipe (plain values); *resources* are
live objects the trainer owns (the executor's runner, the tool host, an LLM) and are handed only to
factories that name them as keyword parameters. The built-in rewards are listed here; a project of
its own adds one with `register(name, factory)` before the recipe is read.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from vprl.rewards.builtin import correctness_reward, executes_reward
from vprl.rewards.protocol import RewardFactory, RewardFn
from vprl.rewards.unit_tests.reward import unit_tests_reward
from vprl.rewards.verifiers.reward import verifier_reward

_REGISTRY: dict[str, RewardFactory] = {
    "correctness": correctness_reward,
    "executes": executes_reward,
    "unit_tests": unit_tests_reward,
    "verifier": verifier_reward,
}


def register(name: str, factory: RewardFactory) -> RewardFactory:
    """Add a reward under `name` (a name may be registered once)."""
    if name in _REGISTRY:
        raise ValueError(f"reward {name!r} is registered twice")
    _REGISTRY[name] = factory
    return factory


def reward_names() -> list[str]:
    return sorted(_REGISTRY)


def check_reward_name(name: str) -> None:
    """Fail with the list of valid names when `name` is not registered (config-time check)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown reward {name!r}; registered rewards: {sorted(_REGISTRY)}")


def build_reward(name: str, resources: Mapping[str, Any] | None = None, **settings: Any) -> RewardFn:
    """Instantiate a registered reward; an unknown name fails with the list of valid names.

    `resources` (runner, tool host, ...) are passed to the factory only under the names its
    signature declares, so rewards that need nothing live ignore them.
    """
    check_reward_name(name)
    factory = _REGISTRY[name]
    params = inspect.signature(factory).parameters
    clash = set(settings) & set(resources or {})
    if clash:
        raise ValueError(f"reward {name!r}: setting(s) {sorted(clash)} collide with live resources of the same name")
    live = {k: v for k, v in (resources or {}).items() if k in params}
    try:
        return factory(**settings, **live)
    except TypeError as exc:
        raise ValueError(f"reward {name!r}: bad settings {sorted(settings)}: {exc}") from None
