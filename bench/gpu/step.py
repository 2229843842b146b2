"""A GRPO-shaped step of the recipe's policy without trl (the GPU machine has none), split as trl
splits it: generation, the log-probability pass, forward/backward with the optimizer step; the
execution of the step's programs is the `execution` part (bench/gpu/stack.py), once the tools exist.

The shape is the recipe's (bench/gpu/context.py `RECIPE`): `per_device_train_batch_size *
gradient_accumulation_steps` completions per step, `num_generations` per prompt, up to
`max_completion_length` new tokens, LoRA on the recipe's modules, activation checkpointing as the
recipe sets it. Prompts are the recipe's real ones (prompt layout and in-context examples) for
questions of the shapes world. The policy is random, so it never stops early: every completion has
the full length, a step's worst case."""

from __future__ import annotations

import time
from typing import Any

from bench.gpu import models
from bench.gpu.context import REPO, Context, Peak, allocated_gib


def shape(ctx: Context) -> dict[str, int]:
    """The step's sizes: the recipe's, or a few tokens and sequences at tiny scale."""
    r = ctx.recipe
    if ctx.scale == "tiny":
        return {"generations": 4, "micro_batch": 4, "accumulation": 2, "completion": 16}
    return {"generations": int(r["num_generations"]), "micro_batch": int(r["per_device_train_batch_size"]),
            "accumulation": int(r["gradient_accumulation_steps"]), "completion": int(r["max_completion_length"])}  # fmt: skip


def prompt_settings(ctx: Context) -> dict[str, str | None]:
    """The recipe's prompt (API listing and in-context examples, some 2,400 tokens); at tiny scale the
    bare layout, which a CPU prefills in a fraction of the time."""
    r = ctx.recipe
    if ctx.scale == "tiny":
        return {"variant": r["prompt_variant"], "layout": "bare", "ice_file": None}
    return {"variant": r["prompt_variant"], "layout": r["prompt_layout"], "ice_file": str(REPO / r["prompt_ice_file"])}


def world(ctx: Context) -> None:
    """The shapes world's training questions, the recipe's prompts for them, and per question
    `num_generations` programs (gold and mutants) standing for what the policy would write."""
    from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
    from vprl.data.shapes.mutations import mutate
    from vprl.data.shapes.tasks import load_shapes_task
    from vprl.train.prompts import PromptConfig, PromptTemplate

    s = shape(ctx)
    n_prompts = s["micro_batch"] * s["accumulation"] // s["generations"]
    root = ctx.root / "world"
    build_dataset(BuildConfig(out=str(root), train=16, val=2, winoground=0, sugarcrepe=0, refcoco=0, workers=1))
    gold = load_gold_programs(root)["vqa"]
    examples = [ex for ex in load_shapes_task(root, "train") if ex.query in gold][:n_prompts]
    template = PromptTemplate.from_config(PromptConfig(task="vqa", **prompt_settings(ctx)))
    programs = []
    for ex in examples:
        own = [gold[ex.query], *(m.program for m in mutate(gold[ex.query]))]
        programs += [(ex, own[i % len(own)]) for i in range(s["generations"])]
    ctx.built.update(examples=examples, prompts=[template.build(ex.query) for ex in examples], programs=programs)


def policy(ctx: Context) -> None:
    """The policy at the recipe's size, on the GPU in bf16, LoRA-wrapped as the recipe says."""
    model, tokenizer, figures = lora_policy(ctx, "policy")
    ctx.measured["policy weights"] = figures["resident_gib"]
    prompts = ctx.need("prompts", "world")
    lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    ctx.built.update(policy=model, tokenizer=tokenizer, policy_dir=ctx.root / "policy")
    ctx.rec.write("policy", "built", **figures, prompt_tokens=lengths, prompt_chars=[len(p) for p in prompts])


def lora_policy(ctx: Context, family: str) -> tuple[Any, Any, dict[str, Any]]:
    """A policy of `family`'s size (bench/gpu/sizes.yaml) built on the device, LoRA-wrapped as the
    recipe says; its config and tokenizer go to <root>/<family>."""
    from peft import LoraConfig, get_peft_model

    prompts, programs = ctx.need("prompts", "world"), ctx.need("programs", "world")
    r = ctx.recipe
    before = allocated_gib(ctx.cuda)
    t0 = time.perf_counter()
    corpus = [*prompts, *(p for _, p in programs)]
    model, tokenizer = models.policy(ctx.scale, ctx.root / family, corpus, ctx.device, ctx.dtype, family)
    built_s = time.perf_counter() - t0
    if r.get("activation_checkpointing"):
        # Non-reentrant: the inputs of a LoRA-wrapped frozen base need no grad for it to work.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = LoraConfig(r=int(r["lora_r"]), lora_alpha=float(r["lora_alpha"]), lora_dropout=0.0,
                      target_modules=list(r["lora_target_modules"]), bias="none", task_type="CAUSAL_LM")  # fmt: skip
    model = get_peft_model(model, lora)  # dropout 0: the recipe's disable_dropout
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    figures = dict(params_b=models.params_b(model), lora_params_m=round(trainable / 1e6, 2),
                   resident_gib=round(allocated_gib(ctx.cuda) - before, 3), seconds=round(built_s, 2),
                   device=ctx.device, dtype=str(ctx.dtype).removeprefix("torch."),
                   activation_checkpointing=bool(r.get("activation_checkpointing")))  # fmt: skip
    return model, tokenizer, figures


def step(ctx: Context) -> None:
    """`ctx.steps` steps (the first warms up kernels and the allocator); one record per phase."""
    model, tok = ctx.need("policy", "policy"), ctx.need("tokenizer", "policy")
    out, seconds, peak = run_steps(ctx, "step", model, tok, ctx.steps)
    ctx.measured["policy (training)"] = peak
    ctx.built["step_seconds"] = seconds
    ctx.built["completions"] = out


def codegemma_step(ctx: Context) -> None:
    """CodeGemma's shape: the step again with a Gemma of codegemma-7b's size, whose vocabulary of
    256,000 (8x CodeLlama's) makes the logits of the log-probability pass and the backward, and of
    the top_p correction, 8x larger. One step: its peak memory is the figure, the time is cold."""
    import gc

    model, tok, figures = lora_policy(ctx, "codegemma")
    ctx.rec.write("codegemma_step", "built", **figures)
    try:
        run_steps(ctx, "codegemma_step", model, tok, 1)
    finally:
        del model
        gc.collect()
        if ctx.cuda:
            import torch

            torch.cuda.empty_cache()


def run_steps(
    ctx: Context, part: str, model: Any, tok: Any, steps: int
) -> tuple[list[list[int]], dict[str, float], float]:
    """`steps` GRPO-shaped steps recorded under `part`: the last step's completions, its phases' seconds,
    and the peak memory of forward/backward."""
    import torch

    prompts = ctx.need("prompts", "world")
    s = shape(ctx)
    r = ctx.recipe
    device = next(model.parameters()).device
    ids = [tok(p)["input_ids"] for p in prompts for _ in range(s["generations"])]
    width = max(map(len, ids))
    pad = tok.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids], device=device)
    attention = (torch.arange(width, device=device)[None, :] >= torch.tensor([width - len(x) for x in ids], device=device)[:, None]).long()  # fmt: skip
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=float(r["learning_rate"]))
    peak = 0.0
    for i in range(1, steps + 1):
        label = f"step {i}" + (" (warm-up)" if i == 1 and steps > 1 else "")
        model.eval()
        with torch.no_grad(), Peak(ctx.cuda) as mem:
            t0 = time.perf_counter()
            out = model.generate(input_ids=input_ids, attention_mask=attention, do_sample=True,
                                 temperature=float(r["temperature"]), top_p=float(r["top_p"]),
                                 max_new_tokens=s["completion"], min_new_tokens=s["completion"],
                                 pad_token_id=pad, use_cache=True)  # fmt: skip
            _sync(ctx)
            gen_s = time.perf_counter() - t0
        new = out.shape[1] - width
        ctx.rec.write(part, "generation", step=label, sequences=len(ids), prompt_tokens=width, new_tokens=new,
                      seconds=round(gen_s, 3), tokens_per_s=round(len(ids) * new / gen_s, 1),
                      peak_gib=mem.gib, over_start_gib=mem.over_start_gib)  # fmt: skip
        ctx.measured[f"{part} generation"] = max(ctx.measured.get(f"{part} generation", 0.0), mem.over_start_gib)
        full_mask = torch.cat([attention, torch.ones_like(out[:, width:])], dim=1)
        batches = [slice(j, j + s["micro_batch"]) for j in range(0, len(ids), s["micro_batch"])]
        with torch.no_grad(), Peak(ctx.cuda) as mem:
            t0 = time.perf_counter()
            old = [completion_logps(model, out[b], full_mask[b], new) for b in batches]
            _sync(ctx)
            lp_s = time.perf_counter() - t0
        ctx.rec.write(part, "log-prob pass", step=label, micro_batches=len(batches), seconds=round(lp_s, 3),
                      peak_gib=mem.gib, over_start_gib=mem.over_start_gib)  # fmt: skip
        model.train()
        advantages = torch.randn(len(ids), device=device)
        with Peak(ctx.cuda) as mem:
            t0 = time.perf_counter()
            for b, logp_old in zip(batches, old, strict=True):
                logp = completion_logps(model, out[b], full_mask[b], new)
                ratio = torch.exp(logp - logp_old)  # the GRPO surrogate at one update per generation
                loss = -(ratio * advantages[b, None]).mean() / len(batches)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(
                [p for p in model.parameters() if p.requires_grad], float(r["max_grad_norm"])
            )
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            _sync(ctx)
            fb_s = time.perf_counter() - t0
        peak = max(peak, mem.gib)
        ctx.rec.write(part, "forward/backward", step=label, micro_batches=len(batches), tokens=int(full_mask.sum()),
                      seconds=round(fb_s, 3), peak_gib=mem.gib, over_start_gib=mem.over_start_gib)  # fmt: skip
        seconds = {"generation": gen_s, "log-prob pass": lp_s, "forward/backward": fb_s}
    return out[:, width:].tolist(), seconds, peak


def completion_logps(model: Any, ids: Any, mask: Any, completion: int) -> Any:
    """Per-token log-probabilities of the last `completion` tokens, as trl computes them: the logits
    of those positions only, upcast to fp32, log-softmax gathered at the sampled ids."""
    import torch

    logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=completion + 1).logits[:, :-1]
    logps = torch.log_softmax(logits.float(), dim=-1)
    return logps.gather(-1, ids[:, -completion:, None]).squeeze(-1)


def _sync(ctx: Context) -> None:
    if ctx.cuda:
        import torch

        torch.cuda.synchronize()
