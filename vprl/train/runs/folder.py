"""The run folder: what `vprl/train/rl.py` writes and what export, ACE mining and evaluation read.

    <output_dir>/config.yaml       the resolved recipe (flat; `--config` reads it back)
    <output_dir>/manifest.json     policy, tool stack and thresholds, prompt hash, dataset split ids,
                                   package versions, git commit, algorithm, reward config, seed
    <output_dir>/rollouts.jsonl    one `RolloutRow` per sampled program (vprl.train.rollouts)
    <output_dir>/metrics.jsonl     one row of logged metrics per logging step, with "step"
    <output_dir>/checkpoint-N/     trainer checkpoints (grpo/rloo); rest: iterations/iter-k/adapter
    <output_dir>/adapter/          the final LoRA adapter (safetensors) and the tokenizer

Resume: the same command finds the last checkpoint, and both logs are cut back to its step so the
steps it replays are logged exactly once.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from vprl.train.runs.jsonl import atomic_write, cut_rows, read_rows, up_to

CONFIG_FILE = "config.yaml"
MANIFEST_FILE = "manifest.json"
METRICS_FILE = "metrics.jsonl"
ADAPTER_DIR = "adapter"
# What peft `save_pretrained` writes in an adapter folder.
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PACKAGES = ("vprl", "torch", "transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes", "vllm", "wandb")
# Keys a resumed run may change: how long it runs, how it logs and saves, and the resume switch.
RESUME_MAY_CHANGE = frozenset(
    {
        "max_steps",
        "dataset_sample_cache",  # where the drawn sample is kept, not what is drawn
        "num_train_epochs",
        "save_steps",
        "save_total_limit",
        "logging_steps",
        "report_to",
        "resume",
        "disable_tqdm",
        "program_table_steps",
        "run_name",
        "executor_slots",
    }
)
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


class RunFolderError(ValueError):
    pass


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit(repo: str | Path) -> dict[str, Any]:
    """The commit the code ran at and whether the tree had uncommitted changes (None outside git)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": head, "dirty": bool(dirty)}


def checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint, oldest first. A folder without trainer_state.json
    is a save that never finished (killed mid-write) and is ignored."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = []
    for child in run_dir.iterdir():
        m = _CHECKPOINT.match(child.name)
        if m and child.is_dir() and (child / "trainer_state.json").is_file():
            found.append((int(m.group(1)), child))
    return sorted(found)


def last_checkpoint(run_dir: str | Path) -> tuple[int, Path] | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


def holds_a_run(run_dir: str | Path) -> bool:
    return (Path(run_dir) / MANIFEST_FILE).is_file()


def check_resumable(
    run_dir: str | Path, config: dict[str, Any], resume: bool, defaults: dict[str, Any] | None = None
) -> bool:
    """Whether this start continues an earlier run in `run_dir`. A folder holding a run is resumed
    only with `resume: true` and the same recipe, apart from `RESUME_MAY_CHANGE`; anything else
    fails with the differing keys, before any work. A key the folder's recipe lacks (one added to
    vprl or trl since the run started) is the same where this recipe leaves it at its default,
    `defaults[key]`: the run ran without it, and a new key's default keeps the old behaviour."""
    run_dir = Path(run_dir)
    if not holds_a_run(run_dir):
        return False
    if not resume:
        raise RunFolderError(
            f"output_dir {run_dir} already holds a run; pass --resume true to continue it or choose another output_dir"
        )
    old_path = run_dir / CONFIG_FILE
    old = yaml.safe_load(old_path.read_text(encoding="utf-8")) if old_path.is_file() else {}
    defaults = defaults or {}
    differ = sorted(
        k
        for k in set(old) | set(config)
        if k not in RESUME_MAY_CHANGE
        and old.get(k, None) != config.get(k)
        and not (k not in old and k in defaults and config.get(k) == defaults[k])
    )
    if differ:
        shown = ", ".join(f"{k}: {old.get(k)!r} -> {config.get(k)!r}" for k in differ[:8])
        raise RunFolderError(
            f"output_dir {run_dir} holds a run with a different recipe ({shown}); resume it with the same "
            f"recipe or choose another output_dir"
        )
    return True


def write_config(run_dir: str | Path, config: dict[str, Any]) -> Path:
    path = Path(run_dir) / CONFIG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, yaml.safe_dump(config, sort_keys=True))
    return path


def write_manifest(run_dir: str | Path, manifest: dict[str, Any]) -> Path:
    path = Path(run_dir) / MANIFEST_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")
    return path


class MetricsLog:
    """metrics.jsonl: one JSON object per logging step, with "step"; appends are fsynced."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / METRICS_FILE

    def append(self, row: dict[str, Any]) -> None:
        if "step" not in row:
            raise ValueError("a metrics row needs a 'step'")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row, default=float) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read(self) -> list[dict[str, Any]]:
        return read_rows(self.path)

    def truncate_after(self, step: int | None) -> int:
        """Keep rows with `step <= step` (none when step is None); returns how many were dropped."""
        return cut_rows(self.path, up_to(step, lambda row: row["step"]))


def read_manifest(run: str | Path) -> dict[str, Any]:
    path = Path(run) / MANIFEST_FILE
    if not path.is_file():
        raise RunFolderError(f"{run}: no manifest.json; is this a vprl run folder (vprl/train/rl.py writes one)?")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RunFolderError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise RunFolderError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_config(run: str | Path) -> dict[str, Any]:
    path = Path(run) / CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise RunFolderError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise RunFolderError(f"{path}: expected a mapping, got {type(data).__name__}")
    return data
