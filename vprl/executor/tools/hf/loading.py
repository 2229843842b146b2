"""Placement and loading of transformers models: device, dtype, bitsandbytes quantization, sharing.

Several tools may name the same checkpoint (verify and itm both use CLIP; vqa and caption both use
BLIP-2). `ModelCache` loads each (checkpoint, placement) once; the tool host loads every configured
tool's model before the first call (`HFBackend.preload`), so a cold load never counts against a
call's timeout. `auto` and `cuda` mean this process's GPU (`vprl/executor/tools/devices.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vprl.executor.tools.devices import rank_device
from vprl.executor.tools.errors import ToolUnavailable

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "8bit", "4bit")


@dataclass(frozen=True)
class Placement:
    """Where and how a model's weights live. Frozen so it can key the model cache."""

    device: str = "auto"
    dtype: str = "float32"
    quantization: str = "none"

    def __post_init__(self) -> None:
        for key, value, allowed in (
            ("device", self.device, DEVICES),
            ("dtype", self.dtype, DTYPES),
            ("quantization", self.quantization, QUANTIZATIONS),
        ):
            if value not in allowed and not (key == "device" and str(value).startswith("cuda:")):
                raise ValueError(f"{key} must be one of {list(allowed)}, got {value!r}")


def resolve_device(device: str) -> str:
    """The explicit device a model goes on: `auto` and `cuda` are this training process's GPU
    (`cuda:{LOCAL_RANK % device_count}`), `auto` the CPU when there is no GPU."""
    return rank_device(device)


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def quantization_config(placement: Placement):
    """A `BitsAndBytesConfig` for 8-bit or 4-bit (NF4) weights, or None.

    The 4-bit compute dtype is the placement's dtype, so `dtype: bfloat16` + `4bit` computes in bf16.
    bitsandbytes also runs on CPU (int8 matmuls are cast to float16 internally), which the tests use.
    """
    if placement.quantization == "none":
        return None
    from transformers import BitsAndBytesConfig

    if placement.quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch_dtype(placement.dtype)
    )


def from_pretrained(cls: Any, path: str, placement: Placement) -> Any:
    """`cls.from_pretrained(path)` placed per `placement`, in eval mode."""
    device = resolve_device(placement.device)
    kwargs: dict[str, Any] = {"dtype": torch_dtype(placement.dtype)}
    quant = quantization_config(placement)
    if quant is not None:
        # Quantized weights are created on their device during loading; `.to()` is not allowed afterwards.
        kwargs["quantization_config"] = quant
        kwargs["device_map"] = {"": device}
    try:
        model = cls.from_pretrained(path, **kwargs)
    except OSError as exc:
        raise ToolUnavailable(f"cannot load {cls.__name__} from {path!r}: {exc}") from exc
    if quant is None:
        model = model.to(device)
    return model.eval()


def model_type(path: str) -> str:
    """The checkpoint's `config.json` model_type (e.g. `grounding-dino`, `owlv2`, `clip`, `blip-2`)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path).model_type
    except (OSError, ValueError) as exc:
        raise ToolUnavailable(f"cannot read the model config of {path!r}: {exc}") from exc


def input_device(model: Any):
    """The device inputs must go to (the first parameter's; quantized models place it via device_map)."""
    return next(model.parameters()).device


def float_dtype(model: Any):
    """The dtype pixel inputs must be cast to: the model's floating dtype (int8 weights excluded)."""
    import torch

    for param in model.parameters():
        if param.dtype in (torch.float32, torch.bfloat16, torch.float16):
            return param.dtype
    return torch.float32


class ModelCache:
    """Loads each (kind, checkpoint, placement) once and hands out the same object afterwards."""

    def __init__(self) -> None:
        self._loaded: dict[tuple[str, str, Placement], Any] = {}

    def get(self, kind: str, path: str, placement: Placement, loader: Callable[[str, Placement], Any]) -> Any:
        key = (kind, path, placement)
        if key not in self._loaded:
            self._loaded[key] = loader(path, placement)
        return self._loaded[key]

    def put(self, kind: str, path: str, placement: Placement, obj: Any) -> None:
        """Install an already built model (benchmarks build real-size random models in memory)."""
        self._loaded[(kind, path, placement)] = obj

    def loaded(self) -> list[tuple[str, str, Placement]]:
        return list(self._loaded)
