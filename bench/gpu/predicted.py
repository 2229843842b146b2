"""What the layout check (vprl/train/recipe/layout.py) predicts for the step's policy and ViUniT's tools,
next to what the earlier parts measured. The check's own functions, fed the recipe's values: its
entry point (`plan_layout` on a parsed recipe) needs trl, which the GPU machine lacks."""

from __future__ import annotations

import copy
from types import SimpleNamespace

from bench.gpu import models
from bench.gpu.context import STACKS, Context
from bench.gpu.step import shape


def layout(ctx: Context) -> None:
    from vprl.executor.tools.stack import read_tool_stack
    from vprl.train.recipe import layout as check
    from vprl.train.recipe.prompt_length import measure
    from vprl.train.recipe.sections import RepairArgs

    policy_dir = ctx.need("policy_dir", "policy")
    s = shape(ctx)
    cfg = SimpleNamespace(
        policy=SimpleNamespace(model_name_or_path=str(policy_dir), load_in_4bit=False, load_in_8bit=False,
                               torch_dtype="bfloat16"),
        training=SimpleNamespace(per_device_train_batch_size=s["micro_batch"], max_completion_length=s["completion"],
                                 activation_checkpointing=bool(ctx.recipe.get("activation_checkpointing"))),
        repair=RepairArgs(),  # the step trains one program per question
    )  # fmt: skip
    prompt = measure(ctx.need("prompts", "world"), str(policy_dir))  # the step's own prompts, by its tokenizer
    policy = check.policy_component(cfg, prompt)
    ctx.rec.write("layout", "component", component=policy.name, predicted_gib=round(policy.gib, 3),
                  predicted_as_run_gib=round(policy.gib, 3), measured_gib=_measured(ctx, "policy (training)"),
                  measured_as="peak of forward/backward (the policy alone on the GPU)")  # fmt: skip
    # Without vLLM (QLoRA's only way) trl generates the step's sequences in one `generate`, as the step did.
    sequences = s["generations"] * len(ctx.need("prompts", "world"))
    generation = check.generation_gib(check.model_size(str(policy_dir)), sequences, prompt.tokens, s["completion"])
    ctx.rec.write("layout", "component", component=f"policy generation ({sequences} sequences, transformers)",
                  predicted_gib=round(generation, 6), predicted_as_run_gib=round(generation, 6),
                  measured_gib=_measured(ctx, "step generation"),
                  measured_as="generation's peak over the step's start (the KV cache, the prefill)")  # fmt: skip
    stack = read_tool_stack("viunit")
    as_run = copy.deepcopy(stack)  # what was built: bf16, no quantization
    as_run.update(dtype="bfloat16", quantization="none")
    for block in as_run.values():
        if isinstance(block, dict):
            block.pop("quantization", None)
            block.pop("dtype", None)
    predicted = check.tool_components(stack, None)
    for configured, run in zip(predicted, check.tool_components(as_run, None), strict=True):
        tool = configured.name.removeprefix("tool ").split(",")[0]
        family = models.family_of(tool, STACKS["viunit"])
        ctx.rec.write("layout", "component", component=configured.name, predicted_gib=round(configured.gib, 3),
                      predicted_as_run_gib=round(run.gib, 3), measured_gib=_measured(ctx, f"tool model {family}"),
                      measured_as=f"resident after building {family}")  # fmt: skip
    total = policy.gib + sum(c.gib for c in predicted)
    ctx.rec.write("layout", "component", component="per training GPU", predicted_gib=round(total, 3),
                  predicted_as_run_gib=round(policy.gib + sum(c.gib for c in check.tool_components(as_run, None)), 3),
                  measured_gib=_measured(ctx, "everything"), measured_as="peak while the programs ran (policy and tools resident)")  # fmt: skip


def _measured(ctx: Context, name: str) -> float | None:
    if not ctx.cuda:
        return None  # a CPU's RSS says nothing about a GPU's memory
    value = ctx.measured.get(name)
    return None if value is None else round(value, 3)
