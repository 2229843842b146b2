"""vLLM weight syncs that leave the policy's base weights as they were.

trl pushes a LoRA policy to vLLM by merging the adapter into the base weights in place, reading
them, and unmerging (`VLLMGeneration._iter_named_params`). In bf16 `W + d - d` is not `W`: each
merge and each unmerge rounds, and the adapter changes between syncs, so the base weights the
policy trains on walk away from the checkpoint a little at every step (upstream trl issue 6688;
`bench/lora_merge_drift.py` measures how far). `drift_free_sync` makes one `VLLMGeneration`
compute each merged weight out of place instead, `W + scale·B·A` in float32 rounded once to the
base dtype, and never writes to the model.

Only the plain PEFT path is taken over: every adapter layer a `lora.Linear` on a floating-point
`nn.Linear`, no DoRA or other variant, no LoRA bias, neither FSDP nor DeepSpeed ZeRO-3 (there
trl gathers the sharded parameters around the merge, which this does not replicate). Anything else
keeps trl's own method.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import torch


def unsupported_reason(vllm_generation: Any) -> str | None:
    """Why `drift_free_sync` would leave this instance to trl (None: it can take over)."""
    from accelerate.utils import extract_model_from_parallel, is_peft_model
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.tuners_utils import BaseTunerLayer

    model = vllm_generation.model
    if not is_peft_model(model):
        return "the policy is not a PEFT model (trl syncs its parameters unmerged)"
    dist = getattr(vllm_generation, "_dist", None)
    if dist is None or not hasattr(vllm_generation, "_iter_named_params"):
        return f"{type(vllm_generation).__name__} is not trl's VLLMGeneration (no weight sync to replace)"
    if dist.is_fsdp:
        return "FSDP shards the parameters; trl gathers them around its merge"
    if dist.is_zero3:
        return "DeepSpeed ZeRO-3 shards the parameters; trl gathers them around its merge"
    for name, module in extract_model_from_parallel(model).named_modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        if type(module) is not LoraLinear:
            return f"{name} is a {type(module).__name__}, not a plain lora.Linear"
        if any(a in module.lora_variant for a in module.active_adapters):
            return f"{name} uses a LoRA variant ({type(module.lora_variant[module.active_adapters[0]]).__name__})"
        if any(module.lora_bias.get(a, False) for a in module.active_adapters):
            return f"{name} has a LoRA bias"
        if not module.get_base_layer().weight.is_floating_point():
            return f"{name}'s base weight is quantized ({module.get_base_layer().weight.dtype})"
    return None


def drift_free_sync(vllm_generation: Any) -> bool:
    """Replace this instance's `_iter_named_params` with one that yields merged weights computed out
    of place. Returns whether it did; when it did not (`unsupported_reason`), trl's stays."""
    if unsupported_reason(vllm_generation) is not None:
        return False
    vllm_generation._iter_named_params = types.MethodType(_iter_merged_out_of_place, vllm_generation)
    return True


@torch.no_grad()
def merged_weight(layer: Any) -> torch.Tensor:
    """The layer's weight with its active, unmerged adapters added: float32 sums, one rounding."""
    from peft.utils.other import transpose

    weight = layer.get_base_layer().weight
    pending = [a for a in layer.active_adapters if a in layer.lora_A and a not in layer.merged_adapters]
    if not pending:
        return weight.data
    total = weight.data.to(torch.float32, copy=True)  # never the weight itself, even when it is float32
    for adapter in pending:
        a = layer.lora_A[adapter].weight.to(device=weight.device, dtype=torch.float32)
        b = layer.lora_B[adapter].weight.to(device=weight.device, dtype=torch.float32)
        total += transpose(b @ a, layer.fan_in_fan_out) * layer.scaling[adapter]
    return total.to(weight.dtype)


def _iter_merged_out_of_place(self: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """trl's PEFT branch of `_iter_named_params` (same names, same order, same skips), with the
    in-place merge/unmerge replaced by `merged_weight`."""
    from accelerate.utils import extract_model_from_parallel
    from peft.tuners.tuners_utils import BaseTunerLayer

    model = extract_model_from_parallel(self.model)
    layers = {
        f"{name}.base_layer.weight": module
        for name, module in model.named_modules()
        if isinstance(module, BaseTunerLayer)
    }
    # No grad-mode context around the yields: it would stay switched for the caller between them.
    for name, param in model.named_parameters():
        layer = layers.get(name)
        vllm_name = name.removeprefix("base_model.model.").replace(".base_layer", "")
        if model.prefix in vllm_name or "original_module" in vllm_name:
            continue  # adapter weights (merged into their layer) and modules_to_save's originals
        vllm_name = self._fix_param_name_to_vllm(vllm_name, extra_prefixes=["modules_to_save.default."])
        yield vllm_name, merged_weight(layer) if layer is not None else param.data
