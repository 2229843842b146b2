"""vprl's rewards as verl's custom reward function, for runs on more than one node.

verl loads it from `reward.custom_reward_function` (`path: pkg://train.integrations.for_verl`) and
hands it `reward_kwargs` with every call. Two entry points, one per way verl calls a reward:

- `compute_score`: verl 0.9's reward loop (the `naive` reward manager, its default), one sample per
  call, awaited on a reward worker's event loop as each rollout finishes. The samples that reach one
  worker within `batch_wait_s` of the first are executed and scored together, in one call: one
  sandbox batch, the tool host batching their model calls, the unit-test reward running each test
  image once per distinct program.
- `compute_score_batch`: verl's batch reward manager (`verl.workers.reward_manager.batch`, whose
  `compute_score` takes the lists of a whole step), one call per step.

Settings (`reward_kwargs`): `settings`, the JSON `python -m vprl.train.integrations.verl_data` writes
(a `SessionConfig`), and any of its fields inline (they win); `batch_wait_s`; `unscorable_score`.
Each sample's `extra_info` carries `example` (the `Example` as JSON) and `prompt_tail` (the
prompt's last line, the entry point's signature, put back in front of a completion that is a body).

Each sample's result is `{"score", "status", "scorable", <reward>: value or None, ...}`; verl logs
the extra keys. verl has no unscorable completion (trl's None): a program that failed for our
reasons (`infra_error`), or that no reward could judge, scores the mean of the scorable samples of
its example in the same call, which gives it no advantage under GRPO, or `unscorable_score` when
it has none; `scorable` is False for it.

One scoring session (sandbox supervisor, tool host, rewards) per process and settings, started on
the first call and closed at exit; verl runs `reward.num_workers` reward workers across the nodes.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vprl.data.records import Example
from vprl.train.integrations.session import ScoringSession, SessionConfig
from vprl.train.prompts import completion_to_program
from vprl.train.rollouts.scorer import ScoredBatch

RESERVED = ("score", "status", "scorable")
_lock = threading.Lock()
_sessions: dict[str, ScoringSession] = {}
_windows: dict[tuple[str, asyncio.AbstractEventLoop], _Window] = {}


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    settings: str | None = None,
    batch_wait_s: float = 0.2,
    max_batch: int = 4096,
    unscorable_score: float = 0.0,
    reward_router_address: str | None = None,
    reward_model_tokenizer: Any = None,
    **inline: Any,
) -> dict[str, Any]:
    """One sample (verl 0.9's reward loop); `reward_router_address` and `reward_model_tokenizer`
    are what verl adds when it serves a reward model, unused here."""
    window = scoring_window(settings, inline, batch_wait_s, max_batch, unscorable_score)
    example, program = sample_of(solution_str, extra_info, f"verl sample of {data_source}")
    return (await window.submit(example, program)).row


def scoring_window(
    settings: str | None,
    inline: dict[str, Any],
    batch_wait_s: float = 0.2,
    max_batch: int = 4096,
    unscorable_score: float = 0.0,
) -> _Window:
    """The running event loop's window over the process's session for these settings: what
    `compute_score` submits each sample to, and verl's agent loop each turn's program
    (`vprl.train.integrations.verl_agent`)."""
    if batch_wait_s < 0 or max_batch < 1:
        raise ValueError(f"verl reward: batch_wait_s must be >= 0 and max_batch >= 1, got {batch_wait_s}, {max_batch}")
    key, session = _session(settings, inline)
    loop = asyncio.get_running_loop()
    with _lock:
        window = _windows.get((key, loop))
        if window is None:
            window = _windows[(key, loop)] = _Window(session, batch_wait_s, max_batch, unscorable_score)
    return window


def compute_score_batch(
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Mapping[str, Any] | None],
    settings: str | None = None,
    unscorable_score: float = 0.0,
    batch_wait_s: float | None = None,
    max_batch: int | None = None,
    **inline: Any,
) -> list[dict[str, Any]]:
    """A whole step (verl's batch reward manager), executed and scored in one call. `batch_wait_s`
    and `max_batch` are the per-sample form's, accepted so one `reward_kwargs` serves both."""
    if not (len(data_sources) == len(solution_strs) == len(extra_infos)):
        raise ValueError(
            f"verl reward: {len(data_sources)} data sources, {len(solution_strs)} solutions, {len(extra_infos)} extra_infos"
        )
    _, session = _session(settings, inline)
    pairs = [sample_of(s, e, f"verl sample {i}") for i, (s, e) in enumerate(zip(solution_strs, extra_infos))]
    if not pairs:
        return []
    examples = [example for example, _ in pairs]
    scored = session.score(examples, [program for _, program in pairs])
    return results(scored, examples, unscorable_score)


def close() -> None:
    """Close every scoring session of this process (exit does it too)."""
    with _lock:
        sessions = list(_sessions.values())
        _sessions.clear()
        _windows.clear()
    for session in sessions:
        session.close()


def results(scored: ScoredBatch, examples: Sequence[Example], unscorable_score: float = 0.0) -> list[dict[str, Any]]:
    """verl's per-sample results from a scored batch (see the module docstring for the unscorable)."""
    totals, components = scored.rewards.totals, scored.rewards.components
    clash = sorted(set(components) & set(RESERVED))
    if clash:
        raise ValueError(f"verl reward: rewards named {clash} would hide verl's keys {list(RESERVED)}")
    judged: dict[str, list[float]] = {}
    for example, total in zip(examples, totals, strict=True):
        if total is not None:
            judged.setdefault(example.id, []).append(total)
    out = []
    for i, example in enumerate(examples):
        total = totals[i]
        if total is None:
            group = judged.get(example.id)
            total = sum(group) / len(group) if group else unscorable_score
        row: dict[str, Any] = {"score": float(total), "status": scored.rewards.statuses[i]}
        row["scorable"] = totals[i] is not None
        row.update({name: values[i] for name, values in components.items()})
        out.append(row)
    return out


def _session(settings: str | None, inline: dict[str, Any]) -> tuple[str, ScoringSession]:
    """The process's session for these settings (read and checked once)."""
    key = json.dumps([settings, inline], sort_keys=True, default=str)
    with _lock:
        session = _sessions.get(key)
        if session is None:
            session = _sessions[key] = ScoringSession(_config(settings, inline))
    return key, session


def _config(settings: str | None, inline: dict[str, Any]) -> SessionConfig:
    row: dict[str, Any] = {}
    where = "verl reward_kwargs"
    if settings is not None:
        path = Path(settings)
        if not path.is_file():
            raise ValueError(
                f"verl reward_kwargs: settings: {path} does not exist (python -m vprl.train.integrations.verl_data writes it)"
            )
        try:
            row = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        where = str(path)
        if not isinstance(row, dict):
            raise ValueError(f"{path}: expected a JSON object of SessionConfig's fields")
    return SessionConfig.from_json({**row, **inline}, where + (" with reward_kwargs" if inline and settings else ""))


@functools.lru_cache(maxsize=65536)
def _example(row: str) -> Example:
    try:
        return Example.from_json(json.loads(row), where="extra_info.example")
    except json.JSONDecodeError as exc:
        raise ValueError(f"extra_info.example: not an example's JSON ({exc.msg})") from None


def sample_of(solution: str, extra_info: Mapping[str, Any] | None, where: str) -> tuple[Example, str]:
    missing = [k for k in ("example", "prompt_tail") if not isinstance((extra_info or {}).get(k), str)]
    if missing:
        raise ValueError(
            f"{where}: extra_info lacks {missing} (the example's JSON and the prompt's last line); "
            "prepare the data with python -m vprl.train.integrations.verl_data"
        )
    return _example(extra_info["example"]), completion_to_program(extra_info["prompt_tail"], solution)


@dataclass(frozen=True)
class ScoredSample:
    """One submitted program's outcome: verl's result row, and the scored batch it ran in (`index`
    its row there), which holds its execution result, reward components and unit-test details."""

    row: dict[str, Any]
    batch: ScoredBatch
    index: int


class _Window:
    """Samples that arrive on one event loop within `wait_s` of the first, scored in one call."""

    def __init__(self, session: ScoringSession, wait_s: float, max_batch: int, unscorable_score: float):
        self.session = session
        self.wait_s = wait_s
        self.max_batch = max_batch
        self.unscorable_score = unscorable_score
        self.sizes: deque[int] = deque(maxlen=1000)  # the latest calls' sizes, for tests and logs
        self._pending: list[tuple[Example, str, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Task] = set()  # referenced until done

    async def submit(self, example: Example, program: str) -> ScoredSample:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((example, program, future))
        if len(self._pending) >= self.max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.wait_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        self.sizes.append(len(batch))
        task = asyncio.ensure_future(self._score(batch))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _score(self, batch: list[tuple[Example, str, asyncio.Future]]) -> None:
        futures = [future for *_, future in batch]
        try:
            examples = [example for example, _, _ in batch]
            scored = await self.session.ascore(examples, [program for _, program, _ in batch])
            rows = results(scored, examples, self.unscorable_score)
        except asyncio.CancelledError:
            for future in futures:
                future.cancel()
            raise
        except Exception as exc:  # every sample of the call fails with it, each caller sees it
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
            return
        for i, (future, row) in enumerate(zip(futures, rows, strict=True)):
            if not future.done():  # a caller that gave up (cancelled) has no use for it
                future.set_result(ScoredSample(row, scored, i))
