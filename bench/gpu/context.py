"""What the acceptance's parts share: the sizes, the device, the recipe, and what earlier parts built
(each model is built once and handed on), plus memory measurement on a GPU or a CPU."""

from __future__ import annotations

import importlib.abc
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.gpu.record import Missing, Recorder

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30
# The recipe whose shape the step takes (batch, generations, completion length, LoRA, checkpointing).
RECIPE = REPO / "configs" / "grpo_codellama_gqa_unit_tests.yaml"
STACKS = {"viunit": "clip_336", "vipergpt": "clip_224"}


@dataclass
class Context:
    rec: Recorder
    scale: str  # "real" or "tiny"
    device: str  # "cuda" or "cpu"
    root: Path  # scratch: the shapes world, the policy's config and tokenizer
    calls: int
    steps: int
    sandbox: str  # "auto", "full", "restricted" or "none"
    recipe: dict[str, Any] = field(default_factory=lambda: yaml.safe_load(RECIPE.read_text(encoding="utf-8")))
    built: dict[str, Any] = field(default_factory=dict)  # what earlier parts made, by name
    measured: dict[str, float] = field(default_factory=dict)  # GiB, for the layout comparison

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def dtype(self) -> Any:
        import torch

        return torch.bfloat16 if self.cuda else torch.float32

    def need(self, name: str, made_by: str) -> Any:
        if name not in self.built:
            raise Missing(f"needs the {name} that part {made_by} makes, and it did not")
        return self.built[name]


def allocated_gib(cuda: bool) -> float:
    import torch

    if cuda:
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated() / GIB
    return _rss() / GIB


class Peak:
    """Peak memory while the block runs: the CUDA allocator's, or the process RSS sampled every 2 ms
    on a CPU. `gib` is the peak itself, `over_start_gib` what the block added to what was there."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def __enter__(self) -> Peak:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            self.start = self.peak = _rss()
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: Any) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, _rss())
        self.gib = round(self.peak / GIB, 3)
        self.over_start_gib = round((self.peak - self.start) / GIB, 3)


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Without(importlib.abc.MetaPathFinder):
    """Refuses to import the named top-level packages, as on a machine that lacks them (the GPU
    machine has no trl, datasets, dill, multiprocess or vllm): the CPU test runs the same path."""

    def __init__(self, names: list[str]) -> None:
        self.names = set(names)

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r} (left out by --without)", name=name)
        return None


def hide_packages(names: list[str]) -> None:
    loaded = [n for n in sys.modules if n.split(".")[0] in names]
    if loaded:
        raise RuntimeError(f"--without: {sorted(loaded)[:3]} already imported")
    sys.meta_path.insert(0, Without(names))
