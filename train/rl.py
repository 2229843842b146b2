"""RL fine-tuning of a visual program generator: `accelerate launch train/rl.py --config configs/X.yaml
[--key value ...]` (or `python -m train.rl ...`).

One recipe names the policy, the data, the prompt, the tool stack, the rewards and the algorithm
(`grpo` or `rloo` through trl: `train.online`; `rest`: `train.rest`); see `train.recipe`. Order:

1. parse and check everything the recipe names (`train.recipe.checks`), failing before any work
   with a message naming the key;
2. prepare the run folder (`train.runs`): resume when it holds the same recipe;
3. start the executor (sandbox supervisor + tool host) before any model is loaded;
4. load the policy, build prompts and the trainer, train, save the adapter.
"""

from __future__ import annotations

import logging
import netrc
import os
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from executor.backends import open_backend
from executor.host import ToolHost
from executor.runner import SyncRunner
from rewards.compose import RewardComposer
from train.prompts import prompt_hash
from train.recipe.checks import Checked, validate
from train.recipe.data import build_prompts
from train.recipe.parsing import ConfigError, run_command
from train.recipe.rl_config import RLConfig, parse_rl_config
from train.rollouts.log import RolloutLog
from train.runs import folder as runs
from train.runs.manifest import manifest

logger = logging.getLogger("train.rl")


def setup_reporting(cfg: RLConfig) -> None:
    """wandb runs offline unless the user has credentials (`WANDB_API_KEY`, or `wandb login`'s entry
    in ~/.netrc) or WANDB_MODE says otherwise."""
    report_to = cfg.training.report_to
    if "wandb" not in (report_to if isinstance(report_to, list) else [report_to]):
        return
    if "WANDB_MODE" not in os.environ and not wandb_credentials():
        os.environ["WANDB_MODE"] = "offline"
    os.environ.setdefault("WANDB_DIR", str(Path(cfg.training.output_dir).resolve()))
    os.environ.setdefault("WANDB_PROJECT", "vprl")


def wandb_credentials() -> bool:
    """An API key in the environment, or the netrc entry `wandb login` writes for the wandb host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return bool(host) and netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


@contextmanager
def executor(checked: Checked):
    """The tool backend, tool host and sandboxed runner, for the whole run."""
    backend = open_backend(checked.tool_stack, service=checked.tool_service, **checked.tool_overrides)
    host = ToolHost(backend)
    runner = SyncRunner(host, checked.runner)
    try:
        yield runner, host, backend
    finally:
        runner.close()
        host.close()


def main(argv: list[str] | None = None) -> Path:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg = parse_rl_config(argv, prog="accelerate launch train/rl.py", description=__doc__.split("\n\n")[0])
    checked = validate(cfg)
    setup_reporting(cfg)
    # The trainer's own view of the processes: a bare `PartialState()` on CPU under `accelerate launch
    # --num_processes 2` reports one process (its default is not CPU), and every process would then
    # write the run folder and truncate the logs as if it were the main one.
    state = cfg.training.distributed_state
    logger.info("process %d of %d", state.process_index, state.num_processes)
    if state.is_main_process:
        logger.info("%s", checked.layout.render())
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
            runs.write_manifest(run_dir, manifest(cfg, checked, backend, runner.runner.layers, hashes, checkpoint))
            if cfg.algorithm != "rest":
                step = checkpoint[0] if checkpoint else None
                dropped = RolloutLog.in_run(run_dir).truncate_after(step)
                dropped += runs.MetricsLog(run_dir).truncate_after(step)
                if resuming:
                    logger.info("resuming %s from %s (%d log rows after it dropped)", run_dir, checkpoint, dropped)
        state.wait_for_everyone()
        resources = {"runner": runner, "tool_host": host, "run_dir": str(run_dir)}
        composer = RewardComposer(checked.rewards, resources=resources)
        if cfg.algorithm == "rest":
            from train.rest.run import train_rest

            adapter = train_rest(cfg, prompted, composer, runner, run_dir, hashes)
        else:
            from train.online.run import train_online

            adapter = train_online(cfg, prompted, composer, runner, run_dir, checkpoint, state)
    return adapter


if __name__ == "__main__":
    run_command(main)
