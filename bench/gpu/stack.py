"""The tool stacks' models on the GPU: built once each (`tools`), then the step's programs through the
real executor with them (`execution`), each tool batched against one call at a time (`tool_speed`),
and ViperGPT's models that ViUniT's stack lacks (`vipergpt`)."""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

from bench.gpu import models
from bench.gpu.context import STACKS, Context, Peak, allocated_gib

# The tools measured one call at a time as well; ViUniT's itm is verify's CLIP again.
SPEED_TOOLS = {"viunit": ("detect", "verify", "vqa", "caption"), "vipergpt": ("verify", "depth")}


def backend(ctx: Context, name: str) -> Any:
    """The stack's `hf` backend on this device. BLIP-2's 8-bit in the stack needs quantized
    checkpoints, which random weights are not: every model runs in bf16 (on a CPU, fp32)."""
    from vprl.executor.tools.hf import HFBackend
    from vprl.executor.tools.images import ImageStore
    from vprl.executor.tools.stack import read_tool_stack, stack_settings

    settings = stack_settings(read_tool_stack(name), {})
    settings.update(device=ctx.device, dtype="bfloat16" if ctx.cuda else "float32", quantization="none")
    for tool in models.VISION_TOOLS:
        block = settings.get(tool)
        if isinstance(block, dict):
            block.pop("quantization", None)
            block.pop("dtype", None)
    settings.pop("llm", None)  # ViperGPT's llm is a text model, not a vision tool
    return HFBackend(ImageStore(), **settings)


def build_families(ctx: Context, families: list[str]) -> None:
    """Each family not built yet, one record each: parameters, resident memory, seconds."""
    import torch

    made = ctx.built.setdefault("families", {})
    for family in families:
        if family in made:
            continue
        torch.manual_seed(0)
        before = allocated_gib(ctx.cuda)
        t0 = time.perf_counter()
        made[family] = models.build(family, ctx.scale, ctx.root, ctx.device, ctx.dtype)
        resident = allocated_gib(ctx.cuda) - before
        ctx.measured[f"tool model {family}"] = resident
        ctx.rec.write("tools", "built", family=family, params_b=models.params_b(made[family][0]),
                      resident_gib=round(resident, 3), seconds=round(time.perf_counter() - t0, 2))  # fmt: skip


def tools(ctx: Context) -> None:
    """ViUniT's stack: Grounding DINO, CLIP ViT-L/14-336, BLIP-2 Flan-T5-XXL."""
    b = backend(ctx, "viunit")
    clip = STACKS["viunit"]
    build_families(ctx, list(dict.fromkeys(models.family_of(t, clip) for t in models.VISION_TOOLS if b.supports(t))))
    models.install(b, ctx.built["families"], clip)
    ctx.built["viunit"] = b


def execution(ctx: Context) -> None:
    """The step's programs (gold and mutants of its questions) through the executor, the tools in
    this process, in the sandbox the preflight found workable."""
    from vprl.executor.host import ToolHost
    from vprl.executor.runner import SyncRunner
    from vprl.executor.runner_config import RunnerConfig

    b = ctx.need("viunit", "tools")
    programs = ctx.need("programs", "world")
    slots = min(int(ctx.recipe["executor_slots"]), os.cpu_count() or 1) if ctx.cuda else 2
    config = RunnerConfig(slots=slots, sandbox=ctx.sandbox, timeout_s=float(ctx.recipe["executor_timeout_s"]))
    # Twice: the first warms the models' kernels; each run gets a fresh memo and tool cache, as new
    # questions would.
    for i in (1, 2):
        t0 = time.perf_counter()
        with SyncRunner(ToolHost(b), config) as runner:
            started = time.perf_counter() - t0
            with Peak(ctx.cuda) as mem:
                t1 = time.perf_counter()
                results = runner.run(programs)
                seconds = time.perf_counter() - t1
        calls = sum(len(r.tool_calls) for r in results)
        ctx.measured["everything"] = max(ctx.measured.get("everything", 0.0), mem.gib)
        # Our failures, named: a run whose programs all end in infra_error measured nothing.
        ours = Counter(r.error for r in results if r.status == "infra_error")
        ctx.rec.write("execution", "programs", run=f"{i}" + (" (warm-up)" if i == 1 else ""), sandbox=ctx.sandbox,
                      slots=slots, programs=len(programs), statuses=dict(Counter(r.status for r in results)),
                      tool_calls=calls, seconds=round(seconds, 3), supervisor_start_s=round(started, 3),
                      peak_gib=mem.gib, over_start_gib=mem.over_start_gib,
                      infra_errors=dict(ours.most_common(3)))  # fmt: skip
        if sum(ours.values()) == len(results):
            raise RuntimeError(f"every program ended in infra_error (sandbox {ctx.sandbox}): {ours.most_common(3)}")
    ctx.built["execution_s"] = seconds


def tool_speed(ctx: Context, stack: str = "viunit") -> None:
    """Each tool's calls as one batched request against one call at a time, with peak memory."""
    from bench.tools import make_calls

    b = ctx.need(stack, "tools" if stack == "viunit" else "vipergpt")
    size = (240, 320) if ctx.scale == "real" else (48, 64)
    for tool in SPEED_TOOLS[stack]:
        calls = make_calls(tool, ctx.calls, b.images, size)
        # Warm-up, untimed: one full batch and one single call, so that neither timed pass pays a
        # fresh model's first kernels (on the H200 CLIP-L/224, measured cold, came out 0.77x).
        b.run(tool, calls[: b.tools[tool].max_batch_size])
        b.run(tool, calls[:1])
        passes = {}
        for batched in (True, False):
            if tool == "depth":  # depth maps are cached per image: neither pass may reuse the other's
                b._model("depth").maps.clear()
            with Peak(ctx.cuda) as mem:
                t0 = time.perf_counter()
                if batched:
                    b.run(tool, calls)
                else:
                    for call in calls:
                        b.run(tool, [call])
                if ctx.cuda:
                    import torch

                    torch.cuda.synchronize()
                passes[batched] = (len(calls) / (time.perf_counter() - t0), mem)
        (fast, mem_b), (slow, mem_s) = passes[True], passes[False]
        ctx.rec.write("tool_speed", "tool", stack=stack, tool=tool, model=b.tools[tool].model,
                      batch=b.tools[tool].max_batch_size, calls=len(calls), batched_per_s=round(fast, 2),
                      single_per_s=round(slow, 2), speedup=round(fast / slow, 2), goal="4x",
                      peak_batched_gib=mem_b.gib, peak_single_gib=mem_s.gib)  # fmt: skip


def vipergpt(ctx: Context) -> None:
    """ViperGPT's stack reuses Grounding DINO and BLIP-2; only its CLIP (224 px) and DPT are new."""
    b = backend(ctx, "vipergpt")
    clip = STACKS["vipergpt"]
    build_families(ctx, list(dict.fromkeys(models.family_of(t, clip) for t in models.VISION_TOOLS if b.supports(t))))
    models.install(b, ctx.built["families"], clip)
    ctx.built["vipergpt"] = b
    tool_speed(ctx, "vipergpt")
