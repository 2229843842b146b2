"""The reward registry: reward functions by name, so recipes pick them in YAML.

A reward function scores executed programs: `(examples, results, programs) -> list[float | None]`,
one value per result, `None` where it has nothing to say. It is only called for results whose
execution succeeded (`status == "ok"`); failures are scored by the composition's penalties, and
`infra_error` is never scored at all (see `rewards.compose`).

Functions that need set-up (models, caches) are registered as factories: `register(name)` on a
function taking keyword settings and returning the reward function. Settings come from the YAML
recipe (plain values); *resources* are live objects the trainer owns (the executor's runner, the
tool host, an LLM) and are handed only to factories that name them as keyword parameters.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from data.records import Example
from executor.results import ExecutionResult


class RewardFn(Protocol):
    def __call__(
        self, examples: Sequence[Example], results: Sequence[ExecutionResult], programs: Sequence[str]
    ) -> list[float | None]: ...


RewardFactory = Callable[..., RewardFn]
_REGISTRY: dict[str, RewardFactory] = {}


def register(name: str) -> Callable[[RewardFactory], RewardFactory]:
    def add(factory: RewardFactory) -> RewardFactory:
        if name in _REGISTRY:
            raise ValueError(f"reward {name!r} is registered twice")
        _REGISTRY[name] = factory
        return factory

    return add


def reward_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def check_reward_name(name: str) -> None:
    """Fail with the list of valid names when `name` is not registered (config-time check)."""
    _load_builtin()
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


def _load_builtin() -> None:
    # Built-in rewards register themselves on import; importing here keeps the registry complete
    # however the caller reached it.
    import rewards.builtin  # noqa: F401
    import rewards.unit_tests.reward  # noqa: F401
    import rewards.verifiers.reward  # noqa: F401
