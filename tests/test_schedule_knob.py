"""`global_batch_size`: the samples of one optimizer step over all processes, so that a run on N
processes takes the one-process run's optimizer steps (and its learning-rate schedule) instead of 1/N
of them. The world size is the one the trainer's arguments see: two real processes under
`accelerate launch`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vprl.train.recipe.parsing import ConfigError
from vprl.train.recipe.rl_config import parse_rl_config
from vprl.train.recipe.sections import accumulation_for

REPO = Path(__file__).resolve().parents[1]
RECIPE = {
    "algorithm": "grpo",
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 4,
    "num_generations": 8,
    "use_cpu": True,
    "bf16": False,
    "report_to": "none",
}
# One process's view of the recipe, and whether validation warned about the schedule.
PROBE = """
import json, os, sys, warnings
from vprl.train.recipe.checks import check_schedule
from vprl.train.recipe.rl_config import parse_rl_config
cfg = parse_rl_config(sys.argv[1:])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    check_schedule(cfg)
t = cfg.training
row = {
    "rank": t.process_index, "processes": t.world_size, "accumulation": t.gradient_accumulation_steps,
    "steps_per_generation": t.steps_per_generation, "generation_batch_size": t.generation_batch_size,
    "per_step": t.per_device_train_batch_size * t.world_size * t.gradient_accumulation_steps,
    "warned": [str(w.message) for w in caught],
}
with open(os.path.join(os.environ["PROBE_OUT"], f"rank{t.process_index}.json"), "w") as f:
    json.dump(row, f)
"""


def _recipe(tmp_path: Path, **extra) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({**RECIPE, "output_dir": str(tmp_path / "run"), **extra}))
    return path


def _probe_two_processes(tmp_path: Path, recipe: Path, *overrides: str) -> list[dict]:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    accelerate = str(Path(sys.executable).parent / "accelerate")
    command = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    command += ["--mixed_precision", "no", "--dynamo_backend", "no"]
    command += ["--main_process_port", str(28000 + os.getpid() % 500), str(probe), "--config", str(recipe), *overrides]
    out = tmp_path / "probes"
    out.mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PROBE_OUT": str(out)}
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_global_batch_size_keeps_the_one_process_optimizer_steps_on_two_processes(tmp_path):
    one = parse_rl_config(["--config", str(_recipe(tmp_path)), "--global_batch_size", "32"]).training
    assert (one.world_size, one.gradient_accumulation_steps) == (1, 4)
    two = _probe_two_processes(tmp_path, _recipe(tmp_path), "--global_batch_size", "32")
    assert [r["processes"] for r in two] == [2, 2]
    for row in two:
        assert row["per_step"] == 32 == 8 * 1 * one.gradient_accumulation_steps
        assert (row["accumulation"], row["steps_per_generation"], row["generation_batch_size"]) == (2, 2, 32)
        assert row["warned"] == []


def test_more_processes_without_global_batch_size_warn_that_the_schedule_shrinks(tmp_path):
    rows = _probe_two_processes(tmp_path, _recipe(tmp_path))
    assert [r["per_step"] for r in rows] == [64, 64]  # twice one process's 32: half its optimizer steps
    main, other = rows
    assert len(main["warned"]) == 1 and "set global_batch_size 32" in main["warned"][0]
    assert other["warned"] == []  # once, from the main process


def test_global_batch_size_replaces_the_recipes_accumulation_on_one_process(tmp_path, monkeypatch):
    from vprl.train.recipe import rl_config

    parses = []
    real = rl_config.parse_config
    monkeypatch.setattr(rl_config, "parse_config", lambda *a, **k: parses.append(1) or real(*a, **k))
    cfg = parse_rl_config(["--config", str(_recipe(tmp_path, global_batch_size=64))])
    assert len(parses) == 1  # #36: the trainer's arguments are parsed once (were twice)
    t = cfg.training
    assert (t.gradient_accumulation_steps, t.steps_per_generation, t.generation_batch_size) == (8, 8, 64)
    flat = cfg.to_flat()
    assert flat["global_batch_size"] == 64 and flat["gradient_accumulation_steps"] == 8


@pytest.mark.parametrize(
    "global_batch, per_device, processes, message",
    [
        (36, 8, 1, "per_device_train_batch_size 3 or 4 or 6 divides it"),
        (32, 8, 6, "no per_device_train_batch_size divides it over 6 processes"),
        (32, 8, 8, "8 x 8 = 64"),
    ],
)
def test_global_batch_size_that_the_processes_cannot_split_is_refused(global_batch, per_device, processes, message):
    with pytest.raises(ConfigError, match="global_batch_size") as info:
        accumulation_for(global_batch, per_device, processes)
    assert message in str(info.value)


def test_global_batch_size_must_be_positive(tmp_path):
    with pytest.raises(ConfigError, match="global_batch_size: must be a positive integer"):
        parse_rl_config(["--config", str(_recipe(tmp_path)), "--global_batch_size", "0"])
