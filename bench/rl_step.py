"""Time of an RL step, split into generation, log-probabilities, execution, reward, and update, on
the shapes world, with execution overlapping the log-probability passes and without, side by side.

    python bench/rl_step.py [--algorithm grpo|rloo] [--beta B] [--steps 4] [--prompts 4] [--generations 4]
                            [--max_new_tokens 96] [--policy DIR] [--world DIR] [--slots 2] [--only overlap|sequential]

Without --policy it uses the bootstrapped tiny policy (`vprl.train.bootstrap.fit.ensure_tiny_policy`,
built and cached under runs/tiny_policy on first use) and the world it was trained on. The
trainer is the entry point's own (`vprl.train.online.run.build_trainer`) with the real sandboxed
executor and `shapes` tools; timers wrap its methods:

    generation  sampling completions (trl's generate path, plus the stop-sequence cut)
    logprobs    the old and reference log-probability passes between generation and the rewards
    scoring     wall time of a batch's scoring: programs through the sandboxed runner (tool calls
                included), then composing the rewards; of which `execution` and `reward`
    waited      how long the reward call blocked the step waiting for the scoring
    hidden      scoring time that ran behind the log-probability passes (scoring - waited)
    update      the rest of the step: loss, backward, optimizer

Each mode gets its own executor (runner memo and tool caches start empty) and the same seed, so
both sample the same completions. Which passes exist depends on the algorithm: RLOO always computes
the old log-probabilities, and with beta > 0 the reference ones (the recipes' default is 0 for both); GRPO on
transformers computes neither unless beta > 0 (vLLM importance sampling adds the old ones), so
with beta 0 there is nothing to overlap. On a CPU the tiny policy's passes are short; the
figures are printed, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = {"overlap": True, "sequential": False}
COLUMNS = ("generation", "logprobs", "scoring", "execution", "reward", "waited", "hidden", "update", "step")


def timed(obj, name: str, bucket: str, totals: dict[str, float], when=lambda: True) -> None:
    """Add the wall time of every call of `obj.name` to `totals[bucket]` (only calls made while
    `when()` holds)."""
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
            if not when():
                return original(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                totals[bucket] += time.perf_counter() - t0

    setattr(obj, name, wrapper)


def run_mode(cfg, prompted, composer, runner, out: Path, totals: dict[str, float]) -> list[dict[str, float]]:
    """Train `cfg` for its steps; the figures of each step."""
    from transformers import TrainerCallback

    from vprl.train.online.run import build_trainer

    trainer, _ = build_trainer(cfg, prompted, composer, runner, out)
    adapter = trainer.reward_adapter
    scoring_phase = [False]  # inside `_generate_and_score_completions`: the passes before the rewards

    def enter_scoring_phase(original):
        def wrapper(*args, **kwargs):
            scoring_phase[0] = True
            try:
                return original(*args, **kwargs)
            finally:
                scoring_phase[0] = False

        return wrapper

    trainer._generate_and_score_completions = enter_scoring_phase(trainer._generate_and_score_completions)
    timed(trainer, "_generate_single_turn", "generation", totals)
    timed(trainer, "_get_per_token_logps_and_entropies", "logprobs", totals, when=lambda: scoring_phase[0])
    timed(runner.runner, "run", "execution", totals)
    timed(trainer, "_calculate_rewards", "waited", totals)
    timed(trainer, "training_step", "step", totals)
    per_step: list[dict[str, float]] = []

    class Snapshot(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            row = dict(totals)
            batches = list(adapter.timings)
            adapter.timings.clear()
            row["scoring"] = sum(b.scoring_s for b in batches)
            row["hidden"] = sum(b.hidden_s for b in batches)
            row["update"] = row.get("step", 0) - sum(row.get(k, 0) for k in ("generation", "logprobs", "waited"))
            per_step.append(row)
            totals.clear()

    trainer.add_callback(Snapshot())
    trainer.train()
    return per_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--algorithm", default="grpo", choices=["grpo", "rloo"])
    ap.add_argument("--beta", type=float, default=None, help="KL coefficient (default: the recipe's, 0)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--max_new_tokens", type=int, default=96)
    ap.add_argument("--policy", default=None)
    ap.add_argument("--world", default=None)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--only", choices=sorted(MODES), default=None, help="one mode instead of both")
    args = ap.parse_args()

    if args.policy is None:
        from vprl.train.bootstrap.fit import BootstrapConfig, ensure_tiny_policy

        policy = ensure_tiny_policy(BootstrapConfig())
        world = Path(args.world or policy / "world")
    else:
        policy, world = Path(args.policy), Path(args.world or "")
        if not args.world:
            ap.error("--world is needed with --policy")

    from vprl.executor.backends import open_backend
    from vprl.executor.host import ToolHost
    from vprl.executor.runner import SyncRunner
    from vprl.rewards.compose import RewardComposer
    from vprl.train.recipe.checks import validate
    from vprl.train.recipe.data import build_prompts
    from vprl.train.recipe.rl_config import parse_rl_config

    modes = [args.only] if args.only else list(MODES)
    out = Path(tempfile.mkdtemp(prefix="rl_step_"))
    totals: dict[str, float] = defaultdict(float)
    results: dict[str, list[dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        configs, runners = {}, {}
        for mode in modes:
            argv = [
                f"--algorithm={args.algorithm}",
                f"--model_name_or_path={policy}",
                "--dataset=shapes",
                f"--dataset_root={world}",
                "--prompt_layout=bare",
                "--tool_stack=shapes",
                f"--executor_slots={args.slots}",
                f"--output_dir={out / mode}",
                f"--max_steps={args.steps}",
                f"--num_generations={args.generations}",
                f"--per_device_train_batch_size={args.prompts * args.generations}",
                f"--max_completion_length={args.max_new_tokens}",
                f"--overlap_execution={MODES[mode]}",
                "--report_to=none",
                "--save_strategy=no",
                "--use_cpu=true",
                "--logging_steps=1",
                "--disable_tqdm=true",
            ]
            if args.beta is not None:
                argv.append(f"--beta={args.beta}")
            configs[mode] = parse_rl_config(argv)
        checked = validate(configs[modes[0]])
        prompted = build_prompts(checked.examples, checked.prompts)
        for mode in modes:  # every executor starts before any model is loaded
            runners[mode] = stack.enter_context(
                SyncRunner(
                    ToolHost(open_backend(checked.tool_stack, service=checked.tool_service, **checked.tool_overrides)),
                    checked.runner,
                )
            )
        composers = {m: checked.composer({"runner": runners[m]}) for m in modes}
        timed(RewardComposer, "__call__", "reward", totals)  # once: the class is shared by both modes
        for mode in modes:
            results[mode] = run_mode(configs[mode], prompted, composers[mode], runners[mode], out / mode, totals)

    beta = args.beta if args.beta is not None else configs[modes[0]].training.beta
    print(
        f"\n{args.algorithm} (beta {beta}) on the shapes world: {args.prompts} prompts x {args.generations} samples, "
        f"{args.max_new_tokens} new tokens max, policy {policy}"
    )
    print(f"{'mode':>10} {'step':>4} " + " ".join(f"{c:>10}" for c in COLUMNS) + "  (seconds)")
    for mode in modes:
        for i, row in enumerate(results[mode], 1):
            print(f"{mode:>10} {i:>4} " + " ".join(f"{row.get(c, 0.0):>10.3f}" for c in COLUMNS))
    print("(step 1 includes warm-up: compiling kernels, starting sandboxes, filling tool caches)")
    print("\nsteps 2.. summed:")
    for mode in modes:
        rows = results[mode][1:] or results[mode]
        total = {c: sum(r.get(c, 0.0) for r in rows) for c in COLUMNS}
        share = total["hidden"] / total["scoring"] if total["scoring"] else 0.0
        print(
            f"{mode:>10}: step {total['step']:.3f} s, scoring {total['scoring']:.3f} s, of which hidden behind "
            f"the log-probability passes ({total['logprobs']:.3f} s) {total['hidden']:.3f} s ({share:.0%}); "
            f"the reward call waited {total['waited']:.3f} s"
        )


if __name__ == "__main__":
    main()
