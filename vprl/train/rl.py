"""RL fine-tuning of a visual program generator: `accelerate launch vprl/train/rl.py --config configs/X.yaml
[--key value ...]` (or `python -m vprl.train.rl ...`).

One recipe names the policy, the data, the prompt, the tool stack, the rewards and the algorithm
(`grpo` or `rloo` through trl: `vprl.train.online`; `rest`: `vprl.train.rest`); see `vprl.train.recipe`. Order:

1. parse and check everything the recipe names (`vprl.train.recipe.checks`), failing before any work
   with a message naming the key;
2. prepare the run folder (`vprl.train.runs`): resume when it holds the same recipe;
3. start the executor (sandbox supervisor + tool host) before any model is loaded, then load the
   stack's models on this process's GPU (`vprl/executor/tools/devices.py`) before the first step;
4. load the policy, build prompts and the trainer, train, save the adapter.
"""

from __future__ import annotations

import logging
import netrc
import os
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from vprl.executor.backends import open_backend
from vprl.executor.host import ToolHost
from vprl.executor.runner import SyncRunner
from vprl.executor.tools.devices import rank_device
from vprl.train.prompts import prompt_hash
from vprl.train.recipe.checks import Checked, validate
from vprl.train.recipe.data import build_prompts
from vprl.train.recipe.parsing import ConfigError, run_command
from vprl.train.recipe.rl_config import RLConfig, parse_rl_config
from vprl.train.repair.log import EpisodeLog, episode_logs
from vprl.train.rollouts.log import RolloutLog
from vprl.train.runs import folder as runs
from vprl.train.runs.manifest import manifest

logger = logging.getLogger("vprl.train.rl")


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
    # One wandb run per run folder: a resumed run continues its curves instead of starting a new run.
    os.environ.setdefault("WANDB_RUN_ID", wandb_run_id(Path(cfg.training.output_dir)))
    os.environ.setdefault("WANDB_RESUME", "allow")


def wandb_run_id(run_dir: Path) -> str:
    """The run folder's wandb id, made by whichever process gets there first (O_EXCL), read by the
    others and by every later resume."""
    import secrets

    path = run_dir / "wandb_run_id"
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        for _ in range(50):  # the creator writes right after creating
            text = path.read_text(encoding="utf-8").strip()
            if text:
                return text
            time.sleep(0.1)
        raise RuntimeError(f"{path} is empty: delete it and start again") from None
    run_id = secrets.token_hex(4)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(run_id + "\n")
    return run_id


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


def check_device(trainer_device) -> None:
    """The policy goes where accelerate puts it and every other model where `rank_device` says;
    the layout check plans both by `rank_device`'s rule, so they must be the same GPU."""
    if getattr(trainer_device, "type", None) != "cuda":
        return
    ours = rank_device("cuda")
    if ours != f"cuda:{trainer_device.index or 0}":
        raise RuntimeError(f"accelerate trains this process on {trainer_device} but its tools would load on {ours}")


def cut_logs_back(run_dir: Path, step: int | None) -> int:
    """The run's logs (rollouts, metrics, every process's repair episodes) cut back to `step`, the
    checkpoint a resume restores (None: no checkpoint, nothing kept), so that the steps it replays
    are logged once; returns how many rows went."""
    dropped = RolloutLog.in_run(run_dir).truncate_after(step)
    dropped += runs.MetricsLog(run_dir).truncate_after(step)
    return dropped + sum(EpisodeLog(path).truncate_after(step) for path in episode_logs(run_dir))


@contextmanager
def executor(checked: Checked):
    """The tool backend, tool host and sandboxed runner, for the whole run, with the stack's models
    loaded: the supervisor starts first (lean), then the models, so none loads during a step."""
    backend = open_backend(checked.tool_stack, service=checked.tool_service, **checked.tool_overrides)
    host = ToolHost(backend, rpc_timeout_s=checked.runner.rpc_timeout_s)
    runner = SyncRunner(host, checked.runner)
    try:
        for loaded in host.preload():
            logger.info("tool model loaded: %s", loaded)
        yield runner, host, backend
    finally:
        runner.close()
        host.close()


def main(argv: list[str] | None = None) -> Path:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg = parse_rl_config(argv, prog="accelerate launch vprl/train/rl.py", description=__doc__.split("\n\n")[0])
    checked = validate(cfg)
    setup_reporting(cfg)
    # The trainer's own view of the processes: a bare `PartialState()` on CPU under `accelerate launch
    # --num_processes 2` reports one process (its default is not CPU), and every process would then
    # write the run folder and truncate the logs as if it were the main one.
    state = cfg.training.distributed_state
    check_device(state.device)
    logger.info("process %d of %d on %s", state.process_index, state.num_processes, state.device)
    if state.is_main_process:
        logger.info("%s", checked.layout.render())
    run_dir = Path(cfg.training.output_dir)
    flat = cfg.to_flat()
    try:
        resuming = runs.check_resumable(run_dir, flat, cfg.run.resume, cfg.flat_defaults())
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
                dropped = cut_logs_back(run_dir, checkpoint[0] if checkpoint else None)
                if resuming and checkpoint:
                    logger.info(
                        "resuming %s from step %d (%s; %d log rows after it dropped)",
                        run_dir,
                        checkpoint[0],
                        checkpoint[1],
                        dropped,
                    )
        state.wait_for_everyone()
        resources = {"runner": runner, "tool_host": host, "run_dir": str(run_dir)}
        composer = checked.composer(resources)  # with the mixture's per-entry scopes
        if cfg.algorithm == "rest":
            from vprl.train.rest.run import train_rest

            adapter = train_rest(cfg, prompted, composer, runner, run_dir, hashes)
        else:
            from vprl.train.online.run import train_online

            adapter = train_online(cfg, prompted, composer, runner, run_dir, checkpoint, state)
    if state.is_main_process:
        from vprl.train.export.adapter import write_run_cards

        write_run_cards(run_dir, adapter)  # trl's and peft's generic cards know neither base nor recipe
        print(
            f"adapter: {adapter} (model card: {adapter / 'README.md'}; export: python -m vprl.train.export --run {run_dir})"
        )
    return adapter


if __name__ == "__main__":
    run_command(main)
