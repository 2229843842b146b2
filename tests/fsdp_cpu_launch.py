"""Run a script under `accelerate launch` with FSDP on a CPU-only machine (tests only).

accelerate (1.15) picks FSDP only when the processes sit on an accelerator: `AcceleratorState`
promotes MULTI_GPU/NPU/XPU/... to FSDP, but a CPU run (MULTI_CPU over gloo) stays MULTI_CPU and the
model is wrapped in DDP, silently. PyTorch's FSDP2 (`fully_shard`) itself works on a CPU mesh over
gloo, so this wrapper changes that one decision, nothing else: the launcher, the FSDP plugin built
from the config file, trl, peft and the training script run as they would on GPUs.

Usage: accelerate launch --config_file fsdp.yaml tests/fsdp_cpu_launch.py vprl/train/rl.py --config ...
"""

from __future__ import annotations

import os
import runpy
import sys

from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from accelerate.utils.environment import parse_flag_from_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_original_init = AcceleratorState.__init__


def _init_with_fsdp_on_cpu(self, *args, fsdp_plugin=None, **kwargs):
    _original_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
    if self.distributed_type == DistributedType.MULTI_CPU and parse_flag_from_env("ACCELERATE_USE_FSDP"):
        self.distributed_type = DistributedType.FSDP
        # The plugin the Accelerator built from the launcher's FSDP_* variables (or the same, built here
        # when the state is re-created without one).
        self.fsdp_plugin = fsdp_plugin or FullyShardedDataParallelPlugin()
        print(f"fsdp_cpu_launch: process {self.process_index} uses FSDP{self.fsdp_plugin.fsdp_version}", flush=True)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: fsdp_cpu_launch.py SCRIPT [ARGS ...]")
    AcceleratorState.__init__ = _init_with_fsdp_on_cpu
    sys.argv = sys.argv[1:]
    sys.path[0] = REPO  # the script's imports resolve from the repository root, not from tests/
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
