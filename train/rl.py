"""RL fine-tuning of a visual program generator: `accelerate launch train/rl.py --config configs/X.yaml
[--key value ...]` (or `python -m train.rl ...`).

One recipe names the policy, the data, the prompt, the tool stack, the rewards and the algorithm
(`grpo` or `rloo` through trl, `rest` through `train.rest`); see `train.rl_config`. Order of work:

1. parse and validate everything the recipe names (model, dataset, tool stack, rewards, vLLM),
   failing before any work with a message naming the key;
2. prepare the run folder (`train.runs`): resume when it holds the same recipe;
3. start the executor (sandbox supervisor + tool host) before any model is loaded;
4. load the policy, build prompts and the trainer, train, save the adapter.
"""

from __future__ import annotations

import os
import sys

# Run as a script, Python puts train/ first on sys.path, where our module names (train/evaluate.py)
# would shadow third-party packages of the same name (HF `evaluate`, which transformers imports).
# Replace it by the repository root before importing anything else.
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.getcwd()) == _HERE:
    sys.path[0] = os.path.dirname(_HERE)

import importlib.util  # noqa: E402
import logging  # noqa: E402
import time  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from data.records import Example  # noqa: E402
from executor.host import ToolHost  # noqa: E402
from executor.runner import RunnerConfig, SyncRunner  # noqa: E402
from executor.tools.stack import backend_class, build_backend, read_tool_stack  # noqa: E402
from rewards.compose import RewardComposer, RewardConfig  # noqa: E402
from rewards.registry import check_reward_name  # noqa: E402
from train import runs  # noqa: E402
from train.config import ConfigError  # noqa: E402
from train.policy import check_policy, describe  # noqa: E402
from train.prompts import PromptConfig, prompt_hash  # noqa: E402
from train.rl_config import RLConfig, parse_rl_config  # noqa: E402
from train.rl_data import build_prompts, load_examples, prompt_configs, split_record  # noqa: E402
from train.rollouts import RolloutLog  # noqa: E402

logger = logging.getLogger("train.rl")
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Checked:
    """What validation read: the examples, prompt configs, tool stack and reward config."""

    examples: list[Example]
    prompts: dict[str, PromptConfig]
    tool_stack: dict[str, Any]
    tool_overrides: dict[str, Any]
    rewards: RewardConfig
    runner: RunnerConfig


def validate(cfg: RLConfig) -> Checked:
    """Every check that needs no model and no executor; raises ConfigError naming the key."""
    check_policy(cfg.policy)
    examples = load_examples(cfg.data)
    prompts = prompt_configs(cfg.prompt, examples)
    try:
        stack = read_tool_stack(cfg.executor.tool_stack)
        backend_class(stack["backend"])
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(f"tool_stack: {exc}") from None
    overrides = dict(cfg.executor.tool_overrides)
    if stack["backend"] == "oracle" and cfg.data.dataset == "shapes" and not (stack.get("scene_graphs") or overrides):
        from data.shapes.tasks import scene_graph_files

        overrides["scene_graphs"] = [str(p) for p in scene_graph_files(cfg.data.dataset_root)]
    rewards = reward_config(cfg)
    try:
        runner = RunnerConfig(
            slots=cfg.executor.executor_slots or (os.cpu_count() or 1),
            timeout_s=cfg.executor.executor_timeout_s,
            max_rpcs=cfg.executor.executor_max_rpcs,
            sandbox=cfg.executor.executor_sandbox,
        )
    except ValueError as exc:
        raise ConfigError(f"executor: {exc}") from None
    check_algorithm(cfg)
    return Checked(examples, prompts, stack, overrides, rewards, runner)


def reward_config(cfg: RLConfig) -> RewardConfig:
    try:
        config = RewardConfig.from_json({"rewards": cfg.rewards.rewards, "penalties": cfg.rewards.reward_penalties})
        names = [spec.name for spec in config.rewards]
        for name in names:
            check_reward_name(name)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"rewards: {exc}") from None
    if not names:
        raise ConfigError("rewards: at least one reward is needed")
    if len(set(names)) != len(names):
        raise ConfigError(f"rewards: each reward may appear once, got {names}")
    return config


def check_algorithm(cfg: RLConfig) -> None:
    t = cfg.training
    if cfg.algorithm == "rest":
        if cfg.rest.rest_generator not in ("hf", "vllm"):
            raise ConfigError(f"rest_generator: {cfg.rest.rest_generator!r} is not one of hf, vllm")
        if cfg.rest.rest_generator == "vllm":
            require_vllm("rest_generator: vllm")
        return
    if t.reward_weights is not None:
        raise ConfigError("reward_weights: set weights in `rewards` ({name, weight}); the total is composed there")
    if t.use_vllm:
        require_vllm("use_vllm")
    if cfg.rewards.stop_at_program_end and t.mask_truncated_completions:
        raise ConfigError(
            "mask_truncated_completions: a completion cut at the end of its program has no EOS and would be "
            "masked as truncated; set stop_at_program_end false to use it"
        )
    # Samples are generated once per window of optimizer steps; a checkpoint inside a window
    # would resume with the window's samples lost (they are not checkpointed).
    window = t.steps_per_generation * t.num_iterations / t.gradient_accumulation_steps
    if window > 1 and t.save_steps >= 1 and t.save_steps % window:
        raise ConfigError(
            f"save_steps: {t.save_steps} is not a multiple of the generation window ({window:g} optimizer steps = "
            "steps_per_generation x num_iterations / gradient_accumulation_steps)"
        )


def require_vllm(key: str) -> None:
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"{key}: vLLM is not installed (it needs a CUDA GPU: pip install 'vprl[vllm]')")


def setup_reporting(cfg: RLConfig) -> None:
    """wandb runs offline unless an API key is configured (or WANDB_MODE says otherwise)."""
    report_to = cfg.training.report_to
    if "wandb" not in (report_to if isinstance(report_to, list) else [report_to]):
        return
    if not os.environ.get("WANDB_API_KEY") and "WANDB_MODE" not in os.environ:
        os.environ["WANDB_MODE"] = "offline"
    os.environ.setdefault("WANDB_DIR", str(Path(cfg.training.output_dir).resolve()))
    os.environ.setdefault("WANDB_PROJECT", "vprl")


@contextmanager
def executor(checked: Checked):
    """The tool backend, tool host and sandboxed runner, for the whole run."""
    backend = build_backend(checked.tool_stack, **checked.tool_overrides)
    host = ToolHost(backend)
    runner = SyncRunner(host, checked.runner)
    try:
        yield runner, host, backend
    finally:
        runner.close()
        host.close()


def manifest(
    cfg: RLConfig,
    checked: Checked,
    backend: Any,
    runner: SyncRunner,
    hashes: dict[str, str],
    checkpoint: tuple[int, Path] | None = None,
) -> dict[str, Any]:
    stack = {k: v for k, v in checked.tool_stack.items() if k != "_source"}
    stack.update(checked.tool_overrides)
    return {
        "algorithm": cfg.algorithm,
        "policy": describe(cfg.policy),
        "tool_stack": {"file": cfg.executor.tool_stack, "config": stack, "backend_hash": backend.config_hash()},
        "executor": {**asdict(checked.runner), "layers": runner.runner.layers},
        "prompt_hash": next(iter(hashes.values())),
        "prompt_hashes": hashes,
        "prompt": {task: c.to_dict() for task, c in checked.prompts.items()},
        "dataset": split_record(cfg.data, checked.examples),
        "rewards": checked.rewards.to_json(),
        "seed": cfg.training.seed,
        "packages": runs.package_versions(),
        "git": runs.git_commit(REPO),
        "command": sys.argv,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "resumed_from": str(checkpoint[1]) if checkpoint else None,
    }


def main(argv: list[str] | None = None) -> Path:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg = parse_rl_config(argv)
    checked = validate(cfg)
    setup_reporting(cfg)
    # The trainer's own view of the processes: a bare `PartialState()` on CPU under `accelerate launch
    # --num_processes 2` reports one process (its default is not CPU), and every process would then
    # write the run folder and truncate the logs as if it were the main one.
    state = cfg.training.distributed_state
    logger.info("process %d of %d", state.process_index, state.num_processes)
    run_dir = Path(cfg.training.output_dir)
    flat = cfg.to_flat()
    try:
        resuming = runs.check_resumable(run_dir, flat, cfg.run.resume)
    except runs.RunFolderError as exc:
        raise ConfigError(str(exc)) from None
    checkpoint = runs.last_checkpoint(run_dir) if resuming and cfg.algorithm != "rest" else None
    state.wait_for_everyone()  # every process has read the folder before the main one writes to it
    prompted = build_prompts(checked.examples, checked.prompts)
    hashes = {task: prompt_hash(c) for task, c in checked.prompts.items()}

    with executor(checked) as (runner, host, backend):
        if state.is_main_process:
            runs.write_config(run_dir, flat)
            runs.write_manifest(run_dir, manifest(cfg, checked, backend, runner, hashes, checkpoint))
            if cfg.algorithm != "rest":
                step = checkpoint[0] if checkpoint else None
                dropped = RolloutLog.in_run(run_dir).truncate_after(step)
                dropped += runs.MetricsLog(run_dir).truncate_after(step)
                if resuming:
                    logger.info("resuming %s from %s (%d log rows after it dropped)", run_dir, checkpoint, dropped)
        state.wait_for_everyone()
        composer = RewardComposer(checked.rewards, resources={"runner": runner, "tool_host": host})
        if cfg.algorithm == "rest":
            from train.rl_rest import train_rest

            adapter = train_rest(cfg, prompted, composer, runner, run_dir, hashes)
        else:
            from train.rl_loop import train_rl

            adapter = train_rl(cfg, prompted, composer, runner, run_dir, checkpoint, state)
    return adapter


__all__ = ["main", "validate"]

if __name__ == "__main__":
    try:
        main()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
