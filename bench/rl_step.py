"""Time of an RL step, split into generation, execution, reward, and update, on the shapes world.

    python bench/rl_step.py [--algorithm grpo|rloo] [--steps 4] [--prompts 4] [--generations 4]
                            [--max_new_tokens 96] [--policy DIR] [--world DIR] [--slots 2]

Without --policy it uses the bootstrapped tiny policy (`train.bootstrap.ensure_tiny_policy`,
built and cached under runs/tiny_policy on first use) and the world it was trained on. The
trainer is the entry point's own (`train.rl_loop.build_trainer`) with the real sandboxed
executor and `shapes` tools; timers wrap its methods:

    generation  sampling completions (trl's generate path, plus the stop-sequence cut)
    execution   programs through the sandboxed runner (tool calls included)
    reward      composing the rewards from the execution results
    update      the rest of the step: log-probabilities, loss, backward, optimizer
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(obj, name: str, bucket: str, totals: dict[str, float]) -> None:
    original = getattr(obj, name)
    if asyncio.iscoroutinefunction(original):

        async def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                totals[bucket] += time.perf_counter() - t0

    else:

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                totals[bucket] += time.perf_counter() - t0

    setattr(obj, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--algorithm", default="grpo", choices=["grpo", "rloo"])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--max_new_tokens", type=int, default=96)
    ap.add_argument("--policy", default=None)
    ap.add_argument("--world", default=None)
    ap.add_argument("--slots", type=int, default=2)
    args = ap.parse_args()

    if args.policy is None:
        from train.bootstrap import BootstrapConfig, ensure_tiny_policy

        policy = ensure_tiny_policy(BootstrapConfig())
        world = Path(args.world or policy / "world")
    else:
        policy, world = Path(args.policy), Path(args.world or "")
        if not args.world:
            ap.error("--world is needed with --policy")

    from executor.host import ToolHost
    from executor.runner import SyncRunner
    from executor.tools.stack import build_backend
    from rewards.compose import RewardComposer
    from train.rl import validate
    from train.rl_config import parse_rl_config
    from train.rl_data import build_prompts
    from train.rl_loop import build_trainer

    out = Path(tempfile.mkdtemp(prefix="rl_step_"))
    argv = [
        f"--algorithm={args.algorithm}",
        f"--model_name_or_path={policy}",
        "--dataset=shapes",
        f"--dataset_root={world}",
        "--prompt_layout=bare",
        "--tool_stack=configs/tools/shapes.yaml",
        f"--executor_slots={args.slots}",
        f"--output_dir={out}",
        f"--max_steps={args.steps}",
        f"--num_generations={args.generations}",
        f"--per_device_train_batch_size={args.prompts * args.generations}",
        f"--max_completion_length={args.max_new_tokens}",
        "--report_to=none",
        "--save_strategy=no",
        "--use_cpu=true",
        "--logging_steps=1",
        "--disable_tqdm=true",
    ]
    cfg = parse_rl_config(argv)
    checked = validate(cfg)
    prompted = build_prompts(checked.examples, checked.prompts)
    totals: dict[str, float] = defaultdict(float)
    per_step: list[dict[str, float]] = []
    with SyncRunner(ToolHost(build_backend(checked.tool_stack)), checked.runner) as runner:
        composer = RewardComposer(checked.rewards, resources={"runner": runner})
        trainer, _ = build_trainer(cfg, prompted, composer, runner, out)
        timed(trainer, "_generate_single_turn", "generation", totals)
        timed(runner.runner, "run", "execution", totals)
        timed(composer.__class__, "__call__", "reward", totals)
        timed(trainer, "training_step", "step", totals)

        from transformers import TrainerCallback

        class Snapshot(TrainerCallback):
            def on_step_end(self, a, state, control, **kw):
                per_step.append(dict(totals))
                totals.clear()

        trainer.add_callback(Snapshot())
        trainer.train()

    print(
        f"\n{args.algorithm} on the shapes world: {args.prompts} prompts x {args.generations} samples, "
        f"{args.max_new_tokens} new tokens max, policy {policy}"
    )
    print(f"{'step':>4} {'generation':>11} {'execution':>10} {'reward':>8} {'update':>8} {'total':>8}  (seconds)")
    for i, t in enumerate(per_step, 1):
        gen, exe, rew, step = t.get("generation", 0), t.get("execution", 0), t.get("reward", 0), t.get("step", 0)
        update = step - gen - exe - rew
        print(f"{i:>4} {gen:>11.2f} {exe:>10.2f} {rew:>8.2f} {update:>8.2f} {step:>8.2f}")
    print("(step 1 includes warm-up: compiling kernels, starting sandboxes, filling tool caches)")


if __name__ == "__main__":
    main()
