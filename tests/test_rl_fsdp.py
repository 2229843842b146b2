"""`vprl/train/rl.py` under FSDP2 with two CPU processes: the real `configs/accelerate/fsdp.yaml`, with only
its GPU-specific keys overridden (use_cpu, no bf16, 2 processes), launched by `accelerate launch`.

accelerate never selects FSDP on a CPU-only machine (the run would silently be DDP over gloo), so the
script runs through `tests/fsdp_cpu_launch.py`, which flips that one decision; the FSDP plugin, trl's
GRPO trainer, peft's LoRA and torch's `fully_shard` then run as they do on GPUs. The checkpoint's
`pytorch_model_fsdp*` (written only by the FSDP save path) proves FSDP ran."""

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from rl_tiny import build_policy, build_world, write_recipe

from vprl.train.rollouts.log import RolloutLog

REPO = Path(__file__).resolve().parents[1]
FSDP_CONFIG = REPO / "configs/accelerate/fsdp.yaml"
LORA_R, HIDDEN = 8, 64  # rl_tiny's policy: hidden size 64; the recipe's LoRA rank 8


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl_fsdp")
    world = build_world(root / "world")
    return world, build_policy(root / "policy", world)


def cpu_fsdp_config(path: Path, port: int) -> Path:
    """configs/accelerate/fsdp.yaml with the keys a CPU run must change; the FSDP keys are the file's."""
    config = yaml.safe_load(FSDP_CONFIG.read_text())
    assert config["distributed_type"] == "FSDP" and config["fsdp_config"]["fsdp_version"] == 2
    config.update(use_cpu=True, mixed_precision="no", num_processes=2, main_process_port=port)
    path.write_text(yaml.safe_dump(config))
    return path


def test_grpo_trains_two_steps_under_fsdp2_on_two_cpu_processes(tmp_path, assets):
    world, policy = assets
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        model_name_or_path=str(policy),
        dataset_root=str(world),
        tool_stack="shapes",
        output_dir=str(tmp_path / "run"),
        warmup_steps=0,
        max_steps=2,
        per_device_train_batch_size=8,  # per process: 2 prompts x 4 samples
        executor_slots=1,
    )
    accelerate_config = cpu_fsdp_config(tmp_path / "fsdp_cpu.yaml", 28000 + os.getpid() % 500)
    command = [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file", str(accelerate_config)]
    command += ["tests/fsdp_cpu_launch.py", "vprl/train/rl.py", "--config", str(recipe)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = tmp_path / "fsdp.log"
    with open(log, "w") as out:
        proc = subprocess.run(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=300)
    text = log.read_text()
    assert proc.returncode == 0, text[-4000:]
    assert "Traceback" not in text
    assert "process 0 of 2" in text and "process 1 of 2" in text
    assert "fsdp_cpu_launch: process 0 uses FSDP2" in text and "fsdp_cpu_launch: process 1 uses FSDP2" in text

    run = tmp_path / "run"
    assert list((run / "checkpoint-2").glob("pytorch_model_fsdp*"))  # FSDP's own checkpoint, in either format
    # both processes sampled their 2 prompts x 4 every step; the main process wrote all rows
    assert Counter(r.step for r in RolloutLog.in_run(run).read()) == {1: 16, 2: 16}

    # The final adapter exists (with a sharded state dict, Trainer.save_model writes nothing under
    # FSDP), holds whole gathered tensors rather than one process's shard, and moved from its start.
    from safetensors.torch import load_file

    weights = load_file(str(run / "adapter" / "adapter_model.safetensors"))
    lora_a = {k: t for k, t in weights.items() if "lora_A" in k}
    lora_b = {k: t for k, t in weights.items() if "lora_B" in k}
    assert lora_a and len(lora_a) == len(lora_b)
    assert all(tuple(t.shape) == (LORA_R, HIDDEN) for t in lora_a.values())
    assert sum(float(t.abs().sum()) for t in lora_b.values()) > 0  # LoRA B starts at zero
