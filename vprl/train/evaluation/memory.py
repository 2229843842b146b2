"""Where an evaluation's models sit on the GPUs and whether they fit, known before any weight loads;
and the release of one policy's sampler before the next policy's starts.

One process evaluates every policy in turn. On the GPUs at the same time: the policy's sampler
(vLLM's engine, which reserves `vllm_gpu_memory_utilization` of GPU 0 when it starts, or the
transformers model), the tool stack's models on the devices the stack names (loaded on their first
call, after the engine started, and kept warm across policies), a second copy of them with the
self-tuning overrides, and the unit-test judge's writer and image generator unless their cache holds
every test. vLLM's own default share, 0.9, would leave the tools nothing, so the evaluation always
passes its own. Sizes and the headroom are training's (`vprl.train.recipe.layout`).

Releasing a vLLM engine takes more than dropping it: its engine core (a process of its own, or
in-process state frozen out of the garbage collector's reach) keeps the GPU memory until it is
shut down. The next engine only starts once GPU 0 has its share free again.
"""

from __future__ import annotations

import gc
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vprl.train.recipe.layout import (
    BYTES,
    GIB,
    HEADROOM,
    Component,
    generation_gib,
    model_size,
    unit_test_components,
    visible_gpus,
)

ON_TRAINING_GPU = "each training GPU"  # what `vprl.train.recipe.layout` calls a GPU component
RELEASE_WAIT_S = 60.0  # an engine core process may take a few seconds to exit and hand its memory back
KV_PROMPT_TOKENS = 1024  # prompt length of the transformers policy's cache estimate (as in training)


def gpu_totals() -> list[float]:
    """GiB of each visible GPU (empty: none)."""
    return visible_gpus()


def free_gib(device: int) -> float:
    """GiB free on a GPU now, as the CUDA driver counts it (every process's allocations)."""
    import torch

    return torch.cuda.mem_get_info(device)[0] / GIB


@dataclass
class EvalMemory:
    """The components of one evaluation, each placed on "GPU i", "the CPU" or "not loaded"."""

    components: list[Component]
    gpus: list[float]
    share: float | None  # vLLM's share of GPU 0 (None: the policy samples with transformers)

    def on(self, gpu: int) -> list[Component]:
        return [c for c in self.components if c.where == f"GPU {gpu}"]

    def render(self) -> str:
        lines = ["evaluation memory (estimates, before any weight loads):"]
        for c in self.components:
            size = f"{c.gib:6.1f} GiB" if c.gib else "      -   "
            lines.append(f"  {c.name:<40} {size}  {c.where}{f'  ({c.note})' if c.note else ''}")
        for i, total in enumerate(self.gpus):
            lines.append(f"  GPU {i}: {sum(c.gib for c in self.on(i)):.1f} GiB of {total:.1f} GiB")
        return "\n".join(lines)

    def check(self, tools_file: str) -> None:
        """Refuse, in one line naming the components, a GPU asked to hold more than it can."""
        for i, total in enumerate(self.gpus):
            parts = self.on(i)
            need = sum(c.gib for c in parts)
            if need <= HEADROOM * total:
                continue
            listing = ", ".join(f"{c.name} {c.gib:.1f} GiB" for c in parts if c.gib)
            head = f"GPU {i} ({total:.1f} GiB, {HEADROOM:.0%} usable) would need {need:.1f} GiB: {listing}"
            policy = next((c for c in parts if c.name.startswith("policy vLLM")), None)
            if policy is not None and self.share is not None:
                fits = math.floor((HEADROOM * total - (need - policy.gib)) / total * 100) / 100  # rounded down
                hint = (
                    f"lower vllm_gpu_memory_utilization to at most {fits:.2f}"
                    if fits > 0
                    else "the rest alone fill the GPU"
                )
                raise ValueError(
                    f"vllm_gpu_memory_utilization: {self.share} of GPU {i} leaves the rest too little. {head}; "
                    f"{hint}, or place tools on another GPU (device: cuda:N) or quantize them in {tools_file}"
                )
            raise ValueError(
                f"tool_stack: {head}; place tools on another GPU (device: cuda:N) or quantize them in {tools_file}"
            )


def _device(device: str, gpus: list[float], what: str) -> str:
    """A tool's placement as a component's `where` ("auto" and "cuda" mean the current device, 0)."""
    if device == "cpu" or not gpus:
        return "the CPU"
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if index >= len(gpus):
        raise ValueError(f"tool_stack: {what} is placed on {device}, but {len(gpus)} GPU(s) are visible")
    return f"GPU {index}"


def tool_components(stack: dict[str, Any], gpus: list[float], label: str = "tool") -> list[Component]:
    """The stack's models, once per checkpoint and placement (tools sharing one share it), each on
    the device its placement names; an `llm` tool on vLLM reserves its own share of its GPU."""
    if stack.get("backend") != "hf":
        return [Component(f"{label}s ({stack.get('backend')})", "the CPU", 0.0)]
    from vprl.executor.tools.hf.settings import parse_config
    from vprl.executor.tools.stack import stack_settings

    defaults, tools = parse_config(stack_settings(stack, {}))
    seen: dict[tuple[str, Any], Component] = {}
    for tool, settings in tools.items():
        placement = settings.placement(defaults)
        key = (settings.model, placement)
        if key in seen:
            seen[key] = Component(f"{seen[key].name}, {tool}", seen[key].where, seen[key].gib, seen[key].note)
            continue
        where = _device(placement.device, gpus, f"{tool} ({settings.model})")
        if getattr(settings, "engine", "") == "vllm":
            share = settings.gpu_memory_utilization
            gib = share * gpus[int(where.split()[1])] if where.startswith("GPU") else 0.0
            note = f"{settings.model}, vLLM {share} of the GPU"
        else:
            quant = placement.quantization
            gib = model_size(settings.model).params * BYTES[quant if quant != "none" else placement.dtype] / GIB
            note = settings.model
        seen[key] = Component(f"{label} {tool}", where, gib if where != "the CPU" else 0.0, note)
    return list(seen.values())


def policy_components(cfg: Any, generator: str, gpus: list[float]) -> list[Component]:
    """The policy's sampler on GPU 0: vLLM's reserved share, or the transformers model's weights and
    the cache of one generation batch."""
    size = model_size(cfg.model_name_or_path)
    quant = "4bit" if cfg.load_in_4bit else "8bit" if cfg.load_in_8bit else None
    dtype = cfg.torch_dtype if cfg.torch_dtype in BYTES else "bfloat16"
    weights = size.params * BYTES[quant or dtype] / GIB
    if generator == "vllm":
        gib = cfg.vllm_gpu_memory_utilization * gpus[0]
        if gib <= weights:
            raise ValueError(
                f"vllm_gpu_memory_utilization: {cfg.vllm_gpu_memory_utilization} of GPU 0 is {gib:.1f} GiB, "
                f"not even the policy's weights ({cfg.model_name_or_path}: {weights:.1f} GiB) and their cache; raise it"
            )
        note = f"vllm_gpu_memory_utilization {cfg.vllm_gpu_memory_utilization}; weights {weights:.1f} GiB"
        return [Component("policy vLLM", "GPU 0", gib, note)]
    cache = generation_gib(size, cfg.batch_size, KV_PROMPT_TOKENS, cfg.max_completion_length)
    return [Component("policy (transformers)", "GPU 0", weights + cache, f"weights {weights:.1f} GiB")]


def judge_components(settings: dict[str, Any], gpus: list[float], queries: Callable[[], list[str]]) -> list[Component]:
    """The unit-test judge's writer and image generator: not loaded when its cache holds every test
    of the evaluation's questions (read only when there is a cache to ask)."""
    prepared = False
    if settings.get("cache_dir"):
        from vprl.rewards.unit_tests.reward import unit_tests_reward

        asked = queries()
        prepared = bool(asked) and unit_tests_reward(**settings, runner=object()).missing(asked) == 0
    out = []
    for c in unit_test_components(settings, gpus[0], prepared):
        where = "GPU 0" if c.where == ON_TRAINING_GPU else c.where
        note = "" if c.note.startswith("move:") else c.note
        out.append(Component(c.name, where, c.gib, note))
    return out


def plan_memory(
    cfg: Any,
    generator: str,
    self_tuning: dict[str, Any] | None,
    judge: dict[str, Any] | None,
    queries: Callable[[], list[str]],
    gpus: list[float],
) -> EvalMemory:
    """The evaluation's components on `gpus` (GiB each; empty: everything on the CPU). `queries`
    gives the evaluation's questions, asked only when the judge's cache must be read."""
    if not gpus:
        return EvalMemory([Component("everything", "the CPU", 0.0)], [], None)
    from vprl.executor.tools.stack import read_tool_stack, stack_settings

    stack = read_tool_stack(cfg.tool_stack)
    components = policy_components(cfg, generator, gpus) + tool_components(stack, gpus)
    if self_tuning is not None:  # a second tool host, with its own models
        tuned = {"backend": stack["backend"], **stack_settings(stack, self_tuning)}
        components += tool_components(tuned, gpus, label="self-tuning tool")
    if judge is not None:
        components += judge_components(judge, gpus, queries)
    return EvalMemory(components, gpus, cfg.vllm_gpu_memory_utilization if generator == "vllm" else None)


def check_memory(cfg: Any, generator: str, self_tuning: Any, judge: Any, queries: Callable[[], list[str]]) -> None:
    """Plan the evaluation's memory on the visible GPUs, print where each part goes, refuse what
    cannot fit (one line naming the components and what to change)."""
    plan = plan_memory(cfg, generator, self_tuning, judge, queries, gpu_totals())
    if plan.gpus:
        print(plan.render(), file=sys.stderr)
    plan.check(cfg.tool_stack)


def shutdown_engine(generator: Any) -> bool:
    """Shut down the vLLM engine a generator holds, if it started one; True when it did."""
    engine = getattr(generator, "engine", None)
    if engine is None:
        return False
    core = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
    shutdown = getattr(engine, "shutdown", None) or getattr(core, "shutdown", None)
    if shutdown is None:
        raise RuntimeError(
            f"cannot release the policy's vLLM engine ({type(engine).__name__}): it has neither shutdown() nor "
            "llm_engine.engine_core.shutdown()"
        )
    shutdown()
    generator.close()
    return True


def free_cuda_memory(had_engine: bool) -> None:
    """Return what the released sampler held to the driver (call once nothing refers to it)."""
    import torch

    gc.collect()
    if had_engine:
        # An in-process engine also set up vLLM's model-parallel groups in this process.
        from vllm.distributed import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def wait_for_free(need_gib: float, what: str, wait_s: float = RELEASE_WAIT_S) -> None:
    """Wait until GPU 0 has `need_gib` free (a released engine's process exits asynchronously), or
    fail naming what is missing."""
    deadline = time.monotonic() + wait_s
    while (free := free_gib(0)) < need_gib:
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"{what} needs {need_gib:.1f} GiB free on GPU 0 (its vllm_gpu_memory_utilization), but only "
                f"{free:.1f} GiB are free {wait_s:.0f} s after the previous policy's sampler was released: "
                "another process, or a sampler that was not released, holds the rest"
            )
        time.sleep(0.5)
