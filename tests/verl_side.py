"""verl beside the venv: verl pins transformers<5.11 and cannot join it, so it is installed in a
folder of its own (the Makefile's SIDE_VERL) and its code runs in a subprocess with that folder on
PYTHONPATH, the venv's packages under it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VERL_SIDE = Path(os.environ.get("VPRL_VERL_DIR") or Path(sys.prefix) / "verl")
VERL_CONFIG = REPO / "configs" / "verl"


def verl_env() -> dict[str, str]:
    if not (VERL_SIDE / "verl").is_dir():
        pytest.skip(f"verl is not installed beside the venv ({VERL_SIDE}): pip install --no-deps --target it")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(VERL_SIDE), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore")
    return env


def run_with_verl(script: str, case: dict, folder: Path, timeout: float = 280) -> subprocess.CompletedProcess:
    """`python tests/<script> CASE.json` with verl importable; fails the test with its stderr's tail."""
    path = folder / "case.json"
    path.write_text(json.dumps(case), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / script), str(path)],
        env=verl_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def spread_total(program: str) -> float:
    """A number drawn from a program's text, standing in for its reward where a test needs rewards
    that differ within a group (tests/verl_agent_driver.py)."""
    return zlib.crc32(program.encode()) % 97 / 97
