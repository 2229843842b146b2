"""Warnings, at check time, for settings that fit but would waste a GPU run's time.

- Colocated vLLM's KV cache below one generation batch: vLLM then preempts sequences and recomputes
  them. The cache is the engine's share of the GPU less the policy's bf16 weights and
  `VLLM_OVERHEAD_GIB` (activations, CUDA graphs); a token takes 2 x layers x hidden x 2 bytes (every
  head's keys and values in bf16, which overstates a model with grouped-query attention, so the
  warning errs towards speaking). A rank generates `per_device_train_batch_size x
  steps_per_generation` sequences at once; vLLM's prefix cache stores each prompt once for its
  `num_generations` samples.
- Served tool calls queueing past the client's timeout: every training process runs
  `executor_slots` programs, each with a tool call in flight at worst, against each deployment's
  replicas x `max_batch_size` calls per batch. A call queued behind k batches is answered in time
  only if each batch takes under the timeout / (k + 1); a call past it is an `infra_error` and its
  sample drops out of the step.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

from vprl.executor.runner_config import RunnerConfig
from vprl.executor.serve.deploy import served_settings
from vprl.train.recipe.layout import GIB, ModelSize
from vprl.train.recipe.prompt_length import PromptLength

VLLM_OVERHEAD_GIB = 2.0


def kv_cache_warning(cfg: Any, size: ModelSize, prompt: PromptLength, gpu_gib: float) -> str | None:
    t = cfg.training
    if cfg.algorithm == "rest" or not getattr(t, "use_vllm", False) or t.vllm_mode != "colocate":
        return None
    cache_gib = t.vllm_gpu_memory_utilization * gpu_gib - size.params * 2 / GIB - VLLM_OVERHEAD_GIB
    per_token = 2 * (size.layers or 32) * (size.hidden or 4096) * 2
    sequences = t.per_device_train_batch_size * t.steps_per_generation
    needed = math.ceil(sequences / t.num_generations) * prompt.tokens + sequences * cfg.repair.completion_tokens(
        t.max_completion_length
    )
    fits = max(cache_gib, 0.0) * GIB / per_token
    if fits >= needed:
        return None
    return (
        f"vllm_gpu_memory_utilization {t.vllm_gpu_memory_utilization}: colocated vLLM keeps about {max(cache_gib, 0):.1f} "
        f"GiB of KV cache ({fits:,.0f} tokens) for a generation batch of about {needed:,} tokens ({sequences} sequences, "
        f"prompts of {prompt.tokens} tokens): vLLM will preempt and recompute. Raise the share, or lower "
        "per_device_train_batch_size or steps_per_generation"
    )


def served_tools_warnings(cfg: Any, stack: dict[str, Any]) -> list[str]:
    if cfg.executor.tool_service is None or not isinstance(stack.get("serve"), dict):
        return []
    # What deploy() places: the tools the backend configures (a stack such as shapes configures every
    # tool without a section of its own, so a group naming them must be read the same way).
    settings = served_settings(stack)
    world = int(getattr(cfg.training, "world_size", 1) or 1)
    slots = cfg.executor.executor_slots or (os.cpu_count() or 1)
    concurrent = world * slots
    timeout = RunnerConfig.rpc_timeout_s
    out = []
    for name, placement in settings.placements.items():
        replicas = (placement.autoscaling or {}).get("max_replicas", placement.num_replicas)
        per_batch = replicas * placement.max_batch_size
        if concurrent <= per_batch:
            continue
        batches = math.ceil(concurrent / per_batch)
        out.append(
            f"tool service {name}: {world} process(es) x {slots} executor_slots = {concurrent} calls at once against "
            f"{replicas} replica(s) x max_batch_size {placement.max_batch_size}: the last call waits {batches} "
            f"batches, so each must take under {timeout / batches:.1f} s for it to beat the {timeout:g} s timeout "
            "(past it the call is an infra_error and its sample drops out). Add replicas, or lower executor_slots"
        )
    return out


def warn_capacity(cfg: Any, stack: dict[str, Any], layout: Any) -> list[str]:
    """Warn (from the main process) about each setting above; returns the messages."""
    messages = served_tools_warnings(cfg, stack)
    if layout.gpus and layout.prompt is not None:
        kv = kv_cache_warning(cfg, layout.policy_size, layout.prompt, min(layout.gpus))
        messages += [kv] if kv else []
    if getattr(cfg.training, "process_index", 0) == 0:
        for message in messages:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
    return messages
