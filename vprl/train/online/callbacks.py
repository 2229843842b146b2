"""Trainer callbacks of the RL entry point: the rollouts log, metrics.jsonl (with per-task figures),
the wandb program table.

Rollout rows are made when a batch is scored (on every process), held until the optimizer step
their samples train has finished, gathered to the main process and appended there. A checkpoint
at step N is saved after step N's `on_step_end`, so it never lacks rows of steps <= N, and resume
cuts the log back to N.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from vprl.data.records import Example
from vprl.rewards.correctness import correctness, grounding_scores
from vprl.rewards.trl_adapter import ScoredCompletions
from vprl.train.recipe.mixture import entry_of, has_labels
from vprl.train.rollouts.log import RolloutLog, RolloutRow
from vprl.train.runs.folder import MetricsLog

logger = logging.getLogger(__name__)


class RolloutRecorder(TrainerCallback):
    """`on_batch` for `TrlRewardAdapter`; writes rows once their step is trained."""

    def __init__(self, log: RolloutLog, prompt_hashes: dict[str, str], policy: str, keep_traces: bool = True):
        self.log = log
        self.prompt_hashes = prompt_hashes  # example id -> prompt hash
        self.policy = policy
        self.keep_traces = keep_traces
        self.pending: list[dict[str, Any]] = []
        self.recent: list[RolloutRow] = []  # the last written step's rows (main process), for the table
        self.written = 0

    def on_batch(self, batch: ScoredCompletions) -> None:
        step = batch.global_step + 1  # the optimizer step these samples train (first of them, num_iterations > 1)
        rows = batch.scored.rows(step, batch.examples, batch.programs, "", self.policy, self.keep_traces)
        for row in rows:
            data = row.to_json()
            data["prompt_hash"] = self.prompt_hashes.get(row.example_id, "")
            self.pending.append(data)

    def on_step_end(self, args, state, control, **kwargs):
        from accelerate.utils import gather_object

        ready = [r for r in self.pending if r["step"] <= state.global_step]
        self.pending = [r for r in self.pending if r["step"] > state.global_step]
        # Every process reaches on_step_end: the gather is collective; only the main process writes.
        rows = gather_object(ready) if args.world_size > 1 else ready
        if state.is_world_process_zero and rows:
            rows = [RolloutRow.from_json(r) for r in rows]
            self.written += self.log.append(rows)
            self.recent = rows
        return control


class MetricsRecorder(TrainerCallback):
    """Every logged metrics dict as one metrics.jsonl row with its step (main process).

    Given the rollout recorder and the run's examples, each row also holds per task (a mixture's
    entry, else the examples' task) what the rollouts written since the last row earned:
    `task/<name>/reward` (mean total, masked programs left out), `task/<name>/accuracy` (against the
    labels, a failed program scoring 0; only for examples that have labels, so never for a
    label-free entry), `task/<name>/exception_rate` and `task/<name>/samples`. They go to wandb as
    `train/task/...` beside trl's metrics."""

    def __init__(
        self, log: MetricsLog, rollouts: RolloutRecorder | None = None, examples: dict[str, Example] | None = None
    ):
        self.log = log
        self.rollouts = rollouts
        self.examples = examples or {}
        self._seen: list[RolloutRow] | None = None
        self._pending: dict[str, TaskTally] = {}

    def on_step_end(self, args, state, control, **kwargs):
        # The rollout recorder (an earlier callback) has just written this step's rows, if any; a step
        # inside a generation window writes none and leaves `recent` as it was.
        recent = self.rollouts.recent if self.rollouts is not None else None
        if state.is_world_process_zero and recent and recent is not self._seen:
            self._seen = recent
            for row in recent:
                example = self.examples.get(row.example_id)
                key = task_key(example) if example is not None else row.task or "unknown"
                self._pending.setdefault(key, TaskTally()).add(row, example)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            row = {"step": state.global_step}
            row.update({k: v for k, v in logs.items() if _jsonable(v)})
            tasks = {
                f"task/{key}/{name}": v for key, t in sorted(self._pending.items()) for name, v in t.means().items()
            }
            self._pending = {}
            row.update(tasks)
            self.log.append(row)
            if tasks:
                _to_wandb(tasks, state.global_step)
        return control


def task_key(example: Example) -> str:
    return entry_of(example) or example.task


class TaskTally:
    """One task's rollouts since the last logged row."""

    def __init__(self) -> None:
        self.totals: list[float] = []
        self.accuracy: list[float] = []
        self.failed = 0
        self.samples = 0

    def add(self, row: RolloutRow, example: Example | None) -> None:
        self.samples += 1
        self.failed += row.status != "ok"
        if row.total is not None:
            self.totals.append(row.total)
        if example is not None and has_labels(example):
            self.accuracy.append(accuracy(example, row) if row.status == "ok" else 0.0)

    def means(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {"samples": self.samples, "exception_rate": self.failed / self.samples}
        if self.totals:
            out["reward"] = sum(self.totals) / len(self.totals)
        if self.accuracy:
            out["accuracy"] = sum(self.accuracy) / len(self.accuracy)
        return out


def accuracy(example: Example, row: RolloutRow) -> float:
    """The evaluation's per-question accuracy: a match for questions and captions, IoU >= 0.5 for
    grounding (the reward's continuous IoU is not an accuracy)."""
    if example.task == "grounding":
        return grounding_scores(example, row.answer)["acc50"]
    return correctness(example, row.answer)


def _to_wandb(metrics: dict[str, float | int], step: int) -> None:
    try:
        import wandb
    except ImportError:
        return
    if wandb.run is not None:
        # As ProgramTable: no `step=` (wandb's own step runs ahead of the trainer's); the trainer's
        # step goes in the record as transformers' x-axis.
        wandb.log({**{f"train/{k}": v for k, v in metrics.items()}, "train/global_step": step})


def table_key(global_step: int) -> str:
    """The wandb key of the program table of an optimizer step."""
    return f"programs/step_{global_step}"


class ProgramTable(TrainerCallback):
    """A wandb.Table of the sampled programs of a step, with their traces, every `every` steps.

    With `images` (example id -> image path), each row also carries the picture with the boxes of
    its tool calls (`wandb.Image` box annotations, one class per call), as the run viewer
    (`python -m vprl.train.view`) draws them."""

    def __init__(
        self,
        recorder: RolloutRecorder,
        every: int,
        limit: int = 64,
        images: dict[str, str] | None = None,
        earlier_turns: Callable[[str, str], str] | None = None,
    ):
        """`earlier_turns(example_id, program)`: in a repair run, the turns before the one that wrote
        `program` with the feedback each got, as text (a column of its own)."""
        self.recorder = recorder
        self.every = every
        self.limit = limit
        self.images = images or {}
        self.earlier_turns = earlier_turns

    def on_step_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or self.every <= 0 or state.global_step % self.every:
            return control
        try:
            import wandb
        except ImportError:
            return control
        if wandb.run is None or not self.recorder.recent:
            return control
        columns = ["step", "example_id", "query", "program", "status", "answer", "total", "components", "trace"]
        repair = ["earlier turns"] if self.earlier_turns is not None else []
        table = wandb.Table(columns=[*columns, "image", *repair])
        for row in self.recorder.recent[: self.limit]:
            trace = "\n".join(
                f"{c.get('tool')}({json.dumps(c.get('args'))[:80]}) -> {c.get('result')}" for c in row.tool_calls
            )
            table.add_data(
                row.step,
                row.example_id,
                row.query,
                row.program,
                row.status,
                json.dumps(row.answer),
                row.total,
                json.dumps(row.components),
                trace,
                traced_image(wandb, self.images.get(row.example_id), row),
                *([self.earlier_turns(row.example_id, row.program)] if self.earlier_turns is not None else []),
            )
        # No `step=`: transformers' WandbCallback logs without one, so wandb's own step runs ahead of
        # the trainer's (trl logs its timings as rows of their own), and a record with an older step
        # is dropped. The trainer's step goes in the record, as `train/global_step` (transformers'
        # x-axis for every train/ metric), and in the key: wandb names a table's file after its key
        # and its own step, so `programs/step_120` is the file of optimizer step 120, in one section.
        wandb.log({table_key(state.global_step): table, "train/global_step": state.global_step})
        return control


TABLE_IMAGE_SIDE = 384  # the table's pictures are downscaled to this: wandb uploads every one


def traced_image(wandb: Any, path: str | None, row: RolloutRow) -> Any:
    """The example's picture with a box per detection and per looked-at region of each tool call,
    in the picture's pixels (top-left origin); None without a readable picture."""
    from PIL import Image, UnidentifiedImageError

    from vprl.train.view.traces import call_marks

    if not path:
        return None
    try:
        with Image.open(path) as im:
            size = im.size
            picture = im.convert("RGB")
    except (OSError, UnidentifiedImageError, ValueError):
        logger.warning("program table: cannot read the picture %s of %s", path, row.example_id)
        return None
    scale = min(1.0, TABLE_IMAGE_SIDE / max(size))
    if scale < 1.0:
        picture = picture.resize((max(1, round(size[0] * scale)), max(1, round(size[1] * scale))))
    boxes, labels = [], {}
    for mark in call_marks(row.program, row.tool_calls, size):
        labels[mark.index] = f"#{mark.index} {mark.label}"
        drawn = [(b[:4], f"#{mark.index} {b[5]}", b[4]) for b in mark.boxes]
        if mark.region is not None:
            drawn.append((mark.region, f"#{mark.index} {mark.label} -> {mark.result}"[:120], None))
        for box, caption, score in drawn:
            x0, y0, x1, y1 = (round(v * scale, 1) for v in box)
            entry = {
                "position": {"minX": x0, "minY": y0, "maxX": x1, "maxY": y1},
                "domain": "pixel",
                "class_id": mark.index,
                "box_caption": caption,
            }
            if score is not None:
                entry["scores"] = {"score": float(score)}
            boxes.append(entry)
    if not boxes:
        return wandb.Image(picture)
    return wandb.Image(picture, boxes={"tool_calls": {"box_data": boxes, "class_labels": labels}})


def _jsonable(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)
