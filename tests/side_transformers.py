"""The transformers that `pip install -e ".[vllm]"` lands on, installed by `make setup` beside the venv
(`.venv/tf517`, only what must differ from the venv), and how a test runs a command under it: a
subprocess with that folder first on PYTHONPATH."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIDE = Path(sys.prefix) / "tf517"


def side_env() -> dict[str, str]:
    """The environment of a subprocess under the side transformers; a missing folder is a setup
    fault, named, not a skip (the tests would otherwise pass without testing that version)."""
    if not (SIDE / ".installed").is_file():
        raise AssertionError(f"{SIDE} is not installed: run `make setup` (Makefile target $(VENV)/tf517/.installed)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(SIDE), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="offline")
    return env


def side_version(package: str) -> str:
    """The version of `package` in the side folder, from its dist-info."""
    found = sorted(SIDE.glob(f"{package}-*.dist-info"))
    if len(found) != 1:
        raise AssertionError(f"{SIDE}: expected one {package} dist-info, found {[p.name for p in found]}")
    return found[0].name.removeprefix(f"{package}-").removesuffix(".dist-info")


def side_requires(package: str) -> list[str]:
    """The Requires-Dist lines of `package` in the side folder (its own dependency pins)."""
    meta = SIDE / f"{package}-{side_version(package)}.dist-info" / "METADATA"
    return [
        line.split(":", 1)[1].strip() for line in meta.read_text().splitlines() if line.startswith("Requires-Dist:")
    ]
