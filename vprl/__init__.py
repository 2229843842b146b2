"""vprl: reinforcement learning for visual program generators (docs/architecture.md).

The public API, importable from here:

- vprl's rewards in your own trl script: `program_rewards`, `trl_dataset`, `load_examples`
  (`vprl.train.integrations.for_trl`; README, "Use vprl's rewards in your own trainer");
- the reward registry: `register` a reward of your own, `reward_names`, `build_reward`, and
  `build_rewards`, the composed reward of a `RewardConfig` (docs/rewards.md);
- the config and record types: `RLConfig`, `EvalConfig`, `RewardConfig`, `RewardSpec`,
  `PromptConfig`, `RunnerConfig`, `Example`, `ExecutionResult`, and the sections every command
  shares (docs/configs.md): `ModelArgs`, `ExecutorArgs`, `SamplingArgs`.

Each name is imported on first use, so `import vprl` stays fast and loads neither torch nor trl.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it
_PUBLIC = {
    "program_rewards": "vprl.train.integrations.for_trl",
    "trl_dataset": "vprl.train.integrations.for_trl",
    "load_examples": "vprl.train.integrations.for_trl",
    "register": "vprl.rewards.registry",
    "reward_names": "vprl.rewards.registry",
    "build_reward": "vprl.rewards.registry",
    "build_rewards": "vprl.rewards.build",
    "RewardConfig": "vprl.rewards.compose",
    "RewardSpec": "vprl.rewards.compose",
    "RLConfig": "vprl.train.recipe.rl_config",
    "EvalConfig": "vprl.train.evaluation.config",
    "PromptConfig": "vprl.train.prompts",
    "RunnerConfig": "vprl.executor.runner_config",
    "ModelArgs": "vprl.train.recipe.sections",
    "ExecutorArgs": "vprl.executor.settings",
    "SamplingArgs": "vprl.train.recipe.sections",
    "Example": "vprl.data.records",
    "ExecutionResult": "vprl.executor.results",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        # Read on first use: importlib.metadata imports email and socket, and the sandbox supervisor
        # (which imports vprl) would hand those to every program it forks.
        from importlib import metadata

        try:
            globals()[name] = metadata.version("vprl")
        except metadata.PackageNotFoundError:  # a checkout on sys.path that was never installed
            globals()[name] = "0+unknown"
        return globals()[name]
    if name not in _PUBLIC:
        raise AttributeError(f"module 'vprl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC, "__version__"})
