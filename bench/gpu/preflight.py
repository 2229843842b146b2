"""The preflight: what this machine is, in under 30 s and before any model is built. Each item is
its own record, written as soon as it is known: package versions, which of our entry points import,
the sandbox's isolation probe (and the execution mode that follows from it), the GPU."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import shutil
import time
from typing import Any

from bench.gpu.context import GIB, REPO, Context

# pillow: the shapes world and every image processor need it; opencv: the shapes tools.
PACKAGES = ("torch", "transformers", "peft", "accelerate", "trl", "datasets", "tokenizers", "huggingface_hub",
            "safetensors", "vllm", "bitsandbytes", "numpy", "pyarrow", "pandas", "xxhash", "dill", "multiprocess",
            "pillow", "opencv-python-headless")  # fmt: skip
# Ours last: `vprl.train.rl` needs trl and datasets, the executor and the layout check do not.
MODULES = ("torch", "transformers", "peft", "accelerate", "trl", "datasets", "vprl.executor.runner",
           "vprl.executor.tools.hf", "vprl.train.prompts", "vprl.train.recipe.layout", "vprl.train.recipe.trainer_args", "vprl.train.rl")  # fmt: skip


def versions(hidden: list[str]) -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "missing"
        if name in hidden:
            out[name] += " (hidden by --without)"
    return out


def imports() -> dict[str, str]:
    out = {}
    for name in MODULES:
        t0 = time.monotonic()
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 — what fails to import is the finding
            out[name] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        out[name] = f"ok ({time.monotonic() - t0:.1f} s)"
    return out


def sandbox(asked: str) -> dict[str, Any]:
    """The probe's report and the execution mode the executor's own choice gives (`choose`): `full`
    where every layer works, `restricted` where only namespaces are missing; where neither can start,
    `none` (programs in-process without isolation), said so in the results."""
    from vprl.executor.runner_config import RunnerConfig
    from vprl.executor.sandbox.probe import missing_layers, probe_layers
    from vprl.executor.sandbox.restricted import choose

    layers = probe_layers()
    missing = missing_layers(layers)
    if asked == "none":
        return {
            "layers": layers,
            "missing": missing,
            "sandbox": "none",
            "note": "programs run in-process WITHOUT isolation (`sandbox: none`) as asked",
        }
    mode, why = choose(asked, layers, RunnerConfig().require_layers)
    note = "" if mode != "restricted" else "the restricted sandbox (no namespaces; docs/design-notes.md)"
    if not mode:
        mode, note = "none", f"programs run in-process WITHOUT isolation (`sandbox: none`): {why}"
    return {"layers": layers, "missing": missing, "sandbox": mode, "note": note}


def gpu() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if out["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        out.update(name=props.name, count=torch.cuda.device_count(), total_gib=round(total / GIB, 2),
                   free_gib=round(free / GIB, 2), capability=f"{props.major}.{props.minor}",
                   bf16=torch.cuda.is_bf16_supported())  # fmt: skip
    return out


def machine() -> dict[str, Any]:
    with open("/proc/meminfo") as fh:
        mem_kib = int(fh.readline().split()[1])
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "disk_free_gib": round(shutil.disk_usage(REPO).free / GIB, 1),
        "uid": os.getuid(),
    }


def run(ctx: Context, hidden: list[str]) -> None:
    rec = ctx.rec
    rec.write("preflight", "machine", **machine())
    rec.write("preflight", "versions", **versions(hidden))
    # The probe forks: before CUDA starts in this process.
    probe = sandbox(ctx.sandbox)
    ctx.sandbox = probe["sandbox"]
    rec.write("preflight", "sandbox probe", **probe)
    rec.write("preflight", "gpu", **gpu())
    rec.write("preflight", "imports", **imports())
