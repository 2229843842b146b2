"""GPU acceptance in one command, on a bare CUDA machine with nothing to download:

    python bench/gpu/acceptance.py [--steps 3] [--calls 32] [--json results.json]
    python bench/gpu/acceptance.py --tiny          # the same code at toy sizes, on a CPU (the test)

Every model is built at its published size (bench/gpu/sizes.yaml) with random weights: speed and
memory do not depend on the weights. It prints one table in three parts:

1. tools: each model of the ViUniT and ViperGPT stacks (Grounding DINO, CLIP, BLIP-2, DPT) through the
   `hf` backend, batched at the stack's batch size against one call at a time, with peak memory.
   Goal: batched at least 4x one at a time.
2. GRPO steps of a 7B-shaped Llama (bf16, LoRA r16 on q/k/v/o, transformers generation) with the real
   sandboxed executor and the ViUniT stack in-process: the step split into generation, execution,
   reward and update, and peak memory. The policy samples `max_completion_length` tokens for real;
   the programs then executed are the shapes world's (gold and mutated), since a random policy writes
   none that call a tool. Goal: execution + reward at most 30 % of a step.
3. memory: what the layout check (train/recipe/layout.py) predicted for each component next to what
   was measured.

Packages a bare machine may lack (trl, datasets, ...) come from bench/gpu/wheelhouse (built by
bench/gpu/wheelhouse.sh; see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

GIB = 2**30
STACKS = {"viunit": "clip_336", "vipergpt": "clip_224"}
MEASURED_TOOLS = ("detect", "verify", "vqa", "depth")


def memory_now(cuda: bool) -> float:
    import torch

    if cuda:
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated() / GIB
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / GIB


def stack_backend(name: str, cuda: bool, scale: str) -> Any:
    """The stack's `hf` backend, on this machine's device, bf16 on a GPU (BLIP-2's 8-bit in the stack
    needs quantized checkpoints, which random weights are not: it runs in bf16, twice the memory)."""
    from executor.tools.hf import HFBackend
    from executor.tools.images import ImageStore
    from executor.tools.stack import read_tool_stack, stack_settings

    settings = stack_settings(read_tool_stack(REPO / f"configs/tools/{name}.yaml"), {})
    settings.update(device="cuda" if cuda else "cpu", dtype="bfloat16" if cuda else "float32", quantization="none")
    for tool in ("detect", "verify", "itm", "vqa", "caption", "depth", "llm"):
        block = settings.get(tool)
        if isinstance(block, dict):
            block.pop("quantization", None)
            block.pop("dtype", None)
    settings.pop("llm", None)  # the llm of ViperGPT's stack is not a vision tool
    return HFBackend(ImageStore(), **settings)


def tools_part(scale: str, cuda: bool, root: Path, n_calls: int) -> list[dict[str, Any]]:
    import gc

    import torch

    from bench.gpu import models
    from bench.tools import make_calls, measure

    rows = []
    size = (240, 320) if scale == "real" else (48, 64)
    for name, clip in STACKS.items():
        before = memory_now(cuda)
        backend = stack_backend(name, cuda, scale)
        params = models.install(backend, scale, root, clip)
        resident = memory_now(cuda) - before
        for tool in MEASURED_TOOLS:
            if not backend.supports(tool):
                continue
            calls = make_calls(tool, n_calls, backend.images, size)
            batched, peak_b = measure(backend, tool, calls, True, cuda)
            single, peak_s = measure(backend, tool, calls, False, cuda)
            family = models.FAMILIES.get(tool, clip)
            rows.append({
                "stack": name, "tool": tool, "model": backend.tools[tool].model, "params_b": round(params[family], 3),
                "batch": backend.tools[tool].max_batch_size, "batched_per_s": batched, "single_per_s": single,
                "speedup": batched / single, "peak_gib": max(peak_b, peak_s) / 1024,
            })  # fmt: skip
        rows.append({"stack": name, "tool": "(all models)", "resident_gib": resident})
        del backend
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return rows


def substitute_programs(trainer: Any, tokenizer: Any, bodies: list[str]) -> None:
    """After the policy has sampled (timed, for real), hand the executor real programs: the sampled
    token ids are replaced by those of program bodies, ending in EOS, as a trained policy writes."""
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


def grpo_part(scale: str, cuda: bool, root: Path, steps: int) -> dict[str, Any]:
    import torch

    import train.online.run as online
    from bench.gpu import models
    from bench.rl_step import COLUMNS, run_mode, timed
    from data.shapes import BuildConfig, build_dataset, load_gold_programs
    from data.shapes.mutations import mutate
    from executor.host import ToolHost
    from executor.runner import SyncRunner
    from rewards.compose import RewardComposer
    from train.policy.loading import lora_config
    from train.recipe.checks import validate
    from train.recipe.data import build_prompts
    from train.recipe.layout import plan_layout
    from train.recipe.rl_config import parse_rl_config

    tiny = scale == "tiny"
    world = root / "world"
    build_dataset(BuildConfig(out=str(world), train=64, val=2, winoground=0, sugarcrepe=0, refcoco=0, seed=0))
    gold = load_gold_programs(world)["vqa"]
    programs = [p for g in list(gold.values())[:64] for p in [g, *(m.program for m in mutate(g)[:2])]]
    bodies = ["\n" + p.split("\n", 1)[1].rstrip() for p in programs]
    dtype = torch.bfloat16 if cuda else torch.float32
    policy, policy_dir = models.policy(scale, root / "policy", [*programs, *gold], dtype)
    generations = 4 if tiny else 8
    argv = [
        f"--model_name_or_path={policy_dir}", "--dataset=shapes", f"--dataset_root={world}",
        f"--prompt_layout={'bare' if tiny else 'viunit'}", f"--prompt_variant={'vipergpt' if tiny else 'viunit'}",
        "--tool_stack=configs/tools/viunit.yaml", f"--output_dir={root / 'run'}", f"--max_steps={steps}",
        f"--num_generations={generations}", f"--per_device_train_batch_size={generations * (1 if tiny else 2)}",
        f"--max_completion_length={32 if tiny else 320}", "--report_to=none", "--save_strategy=no",
        "--logging_steps=1", "--disable_tqdm=true", f"--use_cpu={str(not cuda).lower()}",
        f"--bf16={str(cuda).lower()}", "--activation_checkpointing=true", "--lora_r=16", "--lora_alpha=32",
        "--executor_slots=8" if cuda else "--executor_slots=2",
    ]  # fmt: skip
    cfg = parse_rl_config(argv)
    checked = validate(cfg, check_layout=False)
    prompted = build_prompts(checked.examples, checked.prompts)
    backend = stack_backend("viunit", cuda, scale)
    with SyncRunner(ToolHost(backend), checked.runner) as runner:  # the executor starts before the models
        before = memory_now(cuda)
        models.install(backend, scale, root, STACKS["viunit"])
        tools_gib = memory_now(cuda) - before
        online.load_model = lambda args, device=None: (policy, lora_config(args))
        composer = RewardComposer(checked.rewards, resources={"runner": runner})
        trainer_hook = online.build_trainer

        def build_and_substitute(*args, **kwargs):
            trainer, recorder = trainer_hook(*args, **kwargs)
            substitute_programs(trainer, trainer.processing_class, bodies)
            return trainer, recorder

        online.build_trainer = build_and_substitute  # run_mode takes it from the module when it runs
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        start = memory_now(cuda)
        totals = defaultdict(float)
        timed(RewardComposer, "__call__", "reward", totals)
        per_step = run_mode(cfg, prompted, composer, runner, root / "run", totals)
        peak = (torch.cuda.max_memory_allocated() / GIB) if cuda else memory_now(cuda)
    rows = per_step[1:] or per_step
    total = {c: sum(r.get(c, 0.0) for r in rows) for c in COLUMNS}
    gpus = [torch.cuda.get_device_properties(0).total_memory / GIB] if cuda else [80.0]
    predicted = plan_layout(cfg, checked.tool_stack, checked.rewards, [e.query for e in checked.examples], gpus)
    return {
        "steps": per_step,
        "summed": total,
        "exec_reward_share": (total["execution"] + total["reward"]) / total["step"] if total["step"] else 0.0,
        "memory": {"policy (training)": peak - start - tools_gib if cuda else None, "tools (all)": tools_gib},
        "predicted": {c.name: c.gib for c in predicted.components},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tiny", action="store_true", help="toy sizes (the CPU test of this script)")
    ap.add_argument("--steps", type=int, default=3, help="GRPO steps (the first is warm-up)")
    ap.add_argument("--calls", type=int, default=32, help="tool calls per measurement")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    scale = "tiny" if args.tiny else "real"
    device = torch.cuda.get_device_name(0) if cuda else "CPU"
    results: dict[str, Any] = {"device": device, "scale": scale, "date": time.strftime("%Y-%m-%d")}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        results["tools"] = tools_part(scale, cuda, root, args.calls)
        results["grpo"] = grpo_part(scale, cuda, root, args.steps)
    print(render(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=float))
    return results


def render(results: dict[str, Any]) -> str:
    lines = [f"# GPU acceptance: {results['device']}, {results['scale']} sizes, {results['date']}", "", "## 1. tools"]
    lines.append(
        f"{'stack':<9} {'tool':<7} {'params':>7} {'batch':>5} {'batched/s':>10} {'single/s':>9} {'x':>6} {'peak GiB':>9}"
    )
    for r in results["tools"]:
        if "speedup" not in r:
            lines.append(f"{r['stack']:<9} all models resident: {r['resident_gib']:.2f} GiB")
            continue
        goal = "" if r["speedup"] >= 4 else "  (below the 4x goal)"
        lines.append(
            f"{r['stack']:<9} {r['tool']:<7} {r['params_b']:>6.2f}B {r['batch']:>5} {r['batched_per_s']:>10.1f} "
            f"{r['single_per_s']:>9.1f} {r['speedup']:>5.1f}x {r['peak_gib']:>9.2f}{goal}"
        )
    g = results["grpo"]
    s = g["summed"]
    lines += ["", f"## 2. GRPO steps (steps 2..{len(g['steps'])} summed, seconds)"]
    lines.append(
        "  ".join(f"{k} {s[k]:.2f}" for k in ("step", "generation", "logprobs", "execution", "reward", "update"))
    )
    verdict = "meets" if g["exec_reward_share"] <= 0.30 else "misses"
    lines.append(f"execution + reward: {100 * g['exec_reward_share']:.1f} % of a step ({verdict} the 30 % goal)")
    lines += ["", "## 3. memory, predicted by the layout check vs measured (GiB)"]
    for name, value in g["predicted"].items():
        lines.append(f"  predicted {name:<30} {value:6.2f}")
    for name, value in g["memory"].items():
        lines.append(f"  measured  {name:<30} {'n/a (CPU)' if value is None else f'{value:6.2f}'}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
