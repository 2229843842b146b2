"""Which GPU a model of this process goes on: one rule for the code that loads models and for the
layout check that plans them (`vprl/train/recipe/layout.py`).

Under `accelerate launch` every training process sees every GPU of its node and trains on
`cuda:{LOCAL_RANK % device_count}` (accelerate's `PartialState.set_device`). A bare `"cuda"` would
mean the calling thread's current device instead, and a thread starts on device 0: the tool host's
worker thread loads its models there, so every rank's tools would land on GPU 0. Models are
therefore always placed on an indexed device, and work on them runs under `on_device`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from vprl.executor.tools.errors import ToolUnavailable


def _env_int(name: str, default: int, minimum: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"environment variable {name}: expected an integer >= {minimum}, got {value}")
    return value


def local_rank() -> int:
    """This process's index among the training processes of its node (0 when not launched)."""
    return _env_int("LOCAL_RANK", 0, 0)


def local_processes() -> int:
    """How many training processes share this node's GPUs (1 when not launched)."""
    return _env_int("LOCAL_WORLD_SIZE", 1, 1)


def device_index(rank: int, count: int) -> int:
    """The GPU of local rank `rank` among `count` visible ones: accelerate's rule, so the tools of a
    rank sit beside its policy."""
    if count < 1:
        raise ValueError(f"no GPU to place local rank {rank} on")
    return rank % count


def cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def rank_device(device: str = "auto") -> str:
    """`device` made explicit for this process: `auto` is this rank's GPU when there is one, else the
    CPU; `cuda` is this rank's GPU; `cpu` and an indexed `cuda:N` stay as they are."""
    if device == "auto":
        count = cuda_count()
        return f"cuda:{device_index(local_rank(), count)}" if count else "cpu"
    if device == "cuda" or device.startswith("cuda:"):
        count = cuda_count()
        if not count:
            raise ToolUnavailable(f"device {device!r} was asked for but torch sees no CUDA device")
        return device if ":" in device else f"cuda:{device_index(local_rank(), count)}"
    return device


def index_of(device: str) -> int | None:
    """The GPU index of an explicit device (`cuda:3` -> 3), None for the CPU."""
    return int(device.split(":", 1)[1]) if device.startswith("cuda:") else None


@contextlib.contextmanager
def on_device(device: str) -> Iterator[None]:
    """Make `device` the calling thread's current CUDA device for the block: code inside a model or
    library that allocates on plain "cuda" (bitsandbytes, generation utilities) then follows it."""
    index = index_of(device)
    if index is None:
        yield
        return
    import torch

    with torch.cuda.device(index):
        yield


def vllm_refusal(device: str, what: str, instead: str) -> str | None:
    """Why `what`, a vLLM engine started in this process, cannot go on `device`, or None.

    vLLM places an engine it starts itself on the first visible GPU whatever this process's rank;
    only there does it land where the layout check counts it. `instead` says what to do."""
    index = index_of(device)
    if index is None or index == 0:
        return None
    return (
        f"{what}: a vLLM engine started here lands on the first visible GPU, not on this process's {device}; {instead}"
    )
