"""GRPO steps through trl, where trl imports: the entry point's own trainer
(`vprl.train.online.run.build_trainer`) on the already built LoRA policy and ViUniT tools, timed by
bench/rl_step.py's timers. The policy samples for real; the executor then gets the step's programs
(gold and mutants) in place of the random policy's text, which calls no tool."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

from bench.gpu.context import Context
from bench.gpu.record import Missing
from bench.gpu.step import prompt_settings, shape


def substitute_programs(trainer: Any, tokenizer: Any, bodies: list[str]) -> None:
    """After the policy has sampled (timed), the sampled ids become those of program bodies ending
    in EOS, as a trained policy writes them."""
    original = trainer._generate_single_turn
    counter = [0]

    def wrapper(*args, **kwargs):
        out = original(*args, **kwargs)
        ids, logprobs = out if isinstance(out, tuple) else (out, None)
        new = []
        for _ in ids:
            body = bodies[counter[0] % len(bodies)]
            counter[0] += 1
            new.append(tokenizer(body, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        if logprobs is not None:
            logprobs = [[0.0] * len(x) for x in new]
        return (new, logprobs) if isinstance(out, tuple) else new

    trainer._generate_single_turn = wrapper


def grpo_trl(ctx: Context) -> None:
    try:
        import trl  # noqa: F401
    except ImportError as exc:
        raise Missing(f"trl cannot be imported ({exc}); the step part measured the same split without it") from None
    import vprl.train.online.run as online
    from bench.rl_step import run_mode, timed
    from vprl.executor.host import ToolHost
    from vprl.executor.runner import SyncRunner
    from vprl.rewards.compose import RewardComposer
    from vprl.train.recipe.checks import validate
    from vprl.train.recipe.data import build_prompts
    from vprl.train.recipe.rl_config import parse_rl_config

    policy, policy_dir = ctx.need("policy", "policy"), ctx.need("policy_dir", "policy")
    backend = ctx.need("viunit", "tools")
    programs = ctx.need("programs", "world")
    s, r = shape(ctx), ctx.recipe
    slots = min(int(r["executor_slots"]), os.cpu_count() or 1) if ctx.cuda else 2
    argv = [
        f"--model_name_or_path={policy_dir}", "--dataset=shapes", f"--dataset_root={ctx.root / 'world'}",
        f"--dataset_limit={s['micro_batch'] * s['accumulation'] // s['generations']}",
        *(f"--prompt_{k}={v}" for k, v in prompt_settings(ctx).items() if v is not None), "--tool_stack=viunit",
        f"--output_dir={ctx.root / 'trl_run'}", f"--max_steps={ctx.steps}", f"--num_generations={s['generations']}",
        f"--per_device_train_batch_size={s['micro_batch']}", f"--gradient_accumulation_steps={s['accumulation']}",
        f"--max_completion_length={s['completion']}", "--report_to=none", "--save_strategy=no", "--logging_steps=1",
        "--disable_tqdm=true", f"--use_cpu={str(not ctx.cuda).lower()}", f"--bf16={str(ctx.cuda).lower()}",
        f"--activation_checkpointing={str(bool(r.get('activation_checkpointing'))).lower()}",
        f"--executor_slots={slots}", f"--executor_sandbox={ctx.sandbox}", f"--executor_timeout_s={r['executor_timeout_s']}",
    ]  # fmt: skip
    cfg = parse_rl_config(argv)
    checked = validate(cfg, check_layout=False)
    prompted = build_prompts(checked.examples, checked.prompts)
    bodies = ["\n" + p.split("\n", 1)[1].rstrip() for _, p in programs]
    online.load_model = lambda args, device=None: (policy, None)  # already LoRA-wrapped: trl keeps it
    build = online.build_trainer

    def build_and_substitute(*args, **kwargs):
        trainer, recorder = build(*args, **kwargs)
        substitute_programs(trainer, trainer.processing_class, bodies)
        return trainer, recorder

    online.build_trainer = build_and_substitute  # run_mode takes it from the module when it runs
    totals: dict[str, float] = defaultdict(float)
    timed(RewardComposer, "__call__", "reward", totals)
    with SyncRunner(ToolHost(backend), checked.runner) as runner:
        composer = checked.composer({"runner": runner})
        per_step = run_mode(cfg, prompted, composer, runner, ctx.root / "trl_run", totals)
    for i, row in enumerate(per_step, 1):
        ctx.rec.write("grpo_trl", "step", n=f"{i}" + (" (warm-up)" if i == 1 and len(per_step) > 1 else ""),
                      sandbox=ctx.sandbox, **{k: round(v, 3) for k, v in row.items()})  # fmt: skip
