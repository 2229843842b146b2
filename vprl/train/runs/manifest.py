"""The run's manifest (`manifest.json`): what a run was made of, so export, ACE mining and evaluation
can say where an adapter came from. Written by `vprl/train/rl.py` before training starts.

A mixture's run records each entry (its keys, task, share, rows per epoch, split id, whether its
labels were withheld, the rewards scoring it) under `dataset.mixture`, its prompt per entry under
`prompt`, and which entries each reward scored under `reward_scopes`."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vprl.paths import CHECKOUT
from vprl.train.policy.loading import describe
from vprl.train.recipe.checks import Checked
from vprl.train.recipe.data import split_record
from vprl.train.recipe.rl_config import RLConfig
from vprl.train.runs.folder import git_commit, package_versions


def manifest(
    cfg: RLConfig,
    checked: Checked,
    backend: Any,
    layers: Any,
    hashes: dict[str, str],
    checkpoint: tuple[int, Path] | None = None,
) -> dict[str, Any]:
    """`layers`: the sandbox's isolation layers as the executor probed them."""
    stack = {k: v for k, v in checked.tool_stack.items() if k != "_source"}
    stack.update(checked.tool_overrides)
    return {
        "algorithm": cfg.algorithm,
        "policy": describe(cfg.policy),
        "tool_stack": {"file": cfg.executor.tool_stack, "config": stack, "backend_hash": backend.config_hash()},
        "executor": {**asdict(checked.runner), "layers": layers},
        "prompt_hash": next(iter(hashes.values())),
        "prompt_hashes": hashes,
        "prompt": {task: c.to_dict() for task, c in checked.prompts.items()},
        "dataset": split_record(cfg.data, checked.examples, checked.mixture),
        "rewards": checked.rewards.to_json(),
        "reward_scopes": {r: sorted(s) for r, s in (checked.reward_scopes or {}).items()} or None,
        "seed": cfg.training.seed,
        "packages": package_versions(),
        # an installed vprl has no commit of its own (git there would name the surrounding project's)
        "git": git_commit(CHECKOUT) if CHECKOUT else {"commit": None, "dirty": None},
        "command": sys.argv,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "resumed_from": str(checkpoint[1]) if checkpoint else None,
    }
