"""One scoring session: vprl's sandboxed executor, tool host and composed rewards, owned for a
trainer that is not vprl's.

The session starts on first use (or `start()`), loads the tool stack's models before the first
program runs (`ToolHost.preload`: a cold load must not spend the first calls' timeout), and closes
at interpreter exit or at the end of a `with` block. A closed session stays closed: a reward
called after it would otherwise start a second supervisor nobody closes.

A supervisor that dies (killed, out of memory) fails the programs in flight as `infra_error`
(masked) and would fail every later one the same way, silently: before each batch the session
checks it and restarts the executor, with one logged line. A restart that fails, or a supervisor
that dies again before a batch has finished on the restarted one, raises a RuntimeError saying so.

`SessionConfig` is what crosses a process boundary (verl's reward workers read it from JSON).
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vprl.data.records import Example
from vprl.data.retired_names import retired_message
from vprl.data.typed import check_row
from vprl.executor.backends import open_backend
from vprl.executor.host import ToolHost
from vprl.executor.runner import SyncRunner
from vprl.executor.runner_config import RunnerConfig
from vprl.executor.sandbox.child import Limits
from vprl.rewards.build import build_rewards
from vprl.rewards.compose import RewardConfig, RewardSpec
from vprl.rewards.registry import check_reward_name
from vprl.train.rollouts.scorer import ProgramScorer, ScoredBatch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionConfig:
    """rewards: the registry's rewards with weights and settings, and the failure penalties.
    tool_stack: a stack's name ("shapes", "viunit"), its YAML's path, or its settings as a mapping.
    tool_service: the Ray address of a cluster the stack is deployed in (`python -m vprl.executor.serve`);
        None loads the stack's models in this process.
    run_dir: handed to rewards that keep files (the unit tests cache in `<run_dir>/unit_test_cache`)."""

    rewards: RewardConfig = field(default_factory=RewardConfig)
    tool_stack: str | dict[str, Any] = "shapes"
    tool_service: str | None = None
    tool_overrides: dict[str, Any] = field(default_factory=dict)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    run_dir: str | None = None

    def __post_init__(self) -> None:
        for i, spec in enumerate(self.rewards.rewards):
            try:
                check_reward_name(spec.name)
            except ValueError as exc:
                raise ValueError(f"rewards[{i}]: {exc}") from None
        names = [spec.name for spec in self.rewards.rewards]
        if len(set(names)) != len(names):
            raise ValueError(f"rewards: each reward may be named once (its values are reported by name), got {names}")

    def to_json(self) -> dict[str, Any]:
        runner = dataclasses.asdict(self.runner)
        runner["require_layers"] = list(self.runner.require_layers)
        return {
            "rewards": self.rewards.to_json(),
            "tool_stack": self.tool_stack,
            "tool_service": self.tool_service,
            "tool_overrides": dict(self.tool_overrides),
            "runner": runner,
            "run_dir": self.run_dir,
        }

    @classmethod
    def from_json(cls, row: dict[str, Any], where: str = "session") -> SessionConfig:
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a mapping, got {type(row).__name__}")
        for key in row:
            message = retired_message(key, {f.name for f in dataclasses.fields(cls)})
            if message:
                raise ValueError(f"{where}: {message}")
        check_row(cls, row, where)
        values = dict(row)
        if "rewards" in values:
            rewards = values["rewards"]
            if isinstance(rewards, list):  # a recipe's `rewards:` list, default penalties
                rewards = {"rewards": rewards}
            if not isinstance(rewards, dict):
                raise ValueError(f"{where}: rewards: expected a list or {{rewards, penalties}}, got {rewards!r:.60}")
            try:
                values["rewards"] = RewardConfig.from_json(rewards)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        if "runner" in values:
            values["runner"] = runner_from_json(values["runner"], f"{where}: runner")
        try:
            return cls(**values)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


def runner_from_json(row: Any, where: str) -> RunnerConfig:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a mapping of RunnerConfig's fields, got {row!r:.60}")
    check_row(RunnerConfig, row, where)
    values = dict(row)
    if "limits" in values:
        limits = values["limits"]
        if not isinstance(limits, dict):
            raise ValueError(f"{where}: limits: expected a mapping, got {limits!r:.60}")
        check_row(Limits, limits, f"{where}: limits")
        values["limits"] = Limits(**limits)
    if "require_layers" in values:
        values["require_layers"] = tuple(values["require_layers"])
    try:
        return RunnerConfig(**values)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


_WHY = (
    "The supervisor's own messages are on this process's stderr; killed by signal 9 with nothing there is "
    "usually the kernel's out-of-memory killer (see `dmesg`). Make a new session (program_rewards, or restart "
    "the verl reward worker) once the cause is gone."
)


def _death(runner: SyncRunner) -> str:
    """How the runner's supervisor ended, for one line: "(pid 12, killed by signal 9) died"."""
    supervisor = runner.runner.supervisor
    if supervisor is None:
        return "died"
    code = supervisor.proc.poll()
    if code is None:  # running, but its stream broke: as good as dead to us
        return f"(pid {supervisor.proc.pid}) stopped answering"
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    return f"(pid {supervisor.proc.pid}, {how}) died"


def reward_config(rewards: Any, penalties: dict[str, float] | None = None) -> RewardConfig:
    """The rewards as a user names them: a name, names, `{name: weight}`, `RewardSpec`s or
    `{name, weight, settings}` mappings (a recipe's `rewards:` list)."""
    if isinstance(rewards, RewardConfig):
        if penalties is not None:
            raise ValueError("penalties: give them inside the RewardConfig, not beside it")
        return rewards
    if isinstance(rewards, str | RewardSpec):
        rewards = [rewards]
    if isinstance(rewards, dict):
        rows: list[Any] = [{"name": name, "weight": weight} for name, weight in rewards.items()]
    elif isinstance(rewards, list | tuple):
        rows = [dataclasses.asdict(r) if isinstance(r, RewardSpec) else r for r in rewards]
    else:
        raise ValueError(f"rewards: expected names, {{name: weight}} or specs, got {type(rewards).__name__}")
    if not rows:
        raise ValueError("rewards: name at least one reward")
    return RewardConfig.from_json({"rewards": rows, "penalties": dict(penalties or {})})


class ScoringSession:
    """Executes and scores programs; the `Scorer` that `vprl.rewards.trl_adapter` expects."""

    def __init__(self, config: SessionConfig):
        self.config = config
        self._lock = threading.Lock()
        self._scorer: ProgramScorer | None = None
        self._runner: SyncRunner | None = None
        self._host: ToolHost | None = None
        self._closed = False
        self._restarted = False  # the supervisor was restarted and no batch has finished on it yet

    @property
    def started(self) -> bool:
        return self._scorer is not None

    def start(self) -> ProgramScorer:
        """Start the executor and build the rewards (once; later calls return the same scorer)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this vprl scoring session is closed; make a new one")
            if self._scorer is None:
                self._scorer = self._open()
                atexit.register(self.close)
            return self._scorer

    def _open(self) -> ProgramScorer:
        cfg = self.config
        backend = open_backend(cfg.tool_stack, service=cfg.tool_service, **cfg.tool_overrides)
        host = ToolHost(backend, rpc_timeout_s=cfg.runner.rpc_timeout_s)
        try:
            runner = SyncRunner(host, cfg.runner)
        except BaseException:
            host.close()
            raise
        try:
            for loaded in host.preload():
                logger.info("tool model loaded: %s", loaded)
            resources: dict[str, Any] = {"runner": runner, "tool_host": host}
            if cfg.run_dir is not None:
                resources["run_dir"] = cfg.run_dir
            composer = build_rewards(cfg.rewards, resources)
        except BaseException:
            runner.close()
            host.close()
            raise
        self._runner, self._host = runner, host
        return ProgramScorer(runner, composer)

    def _live(self) -> ProgramScorer:
        """The scorer, its executor restarted first if the sandbox supervisor died since the last batch."""
        scorer = self.start()
        runner = scorer.runner
        if runner.runner.alive:
            return scorer
        with self._lock:  # one restart, whichever caller notices first
            if self._closed:
                raise RuntimeError("this vprl scoring session is closed; make a new one")
            if runner.runner.alive:
                return scorer
            died = _death(runner)
            if self._restarted:
                raise RuntimeError(
                    f"vprl's sandbox supervisor {died} again right after a restart; not restarting it a second "
                    f"time. {_WHY}"
                )
            logger.warning("vprl's sandbox supervisor %s; restarting the executor", died)
            try:
                runner.restart()
            except Exception as exc:
                raise RuntimeError(
                    f"vprl's sandbox supervisor {died} and restarting it failed: {exc}. {_WHY}"
                ) from exc
            self._restarted = True
        return scorer

    def _finished(self, scorer: ProgramScorer) -> None:
        if self._restarted and scorer.runner.runner.alive:
            self._restarted = False  # the restarted supervisor ran a whole batch: it is not dying at start

    def close(self) -> None:
        with self._lock:
            self._closed = True
            runner, host = self._runner, self._host
            self._scorer = self._runner = self._host = None
        atexit.unregister(self.close)
        if runner is not None:
            try:
                runner.close()
            finally:
                host.close()

    def score(self, examples: Sequence[Example], programs: Sequence[str]) -> ScoredBatch:
        scorer = self._live()
        scored = scorer.score(examples, programs)
        self._finished(scorer)
        return scored

    async def ascore(self, examples: Sequence[Example], programs: Sequence[str]) -> ScoredBatch:
        # Starting or restarting blocks (a supervisor, perhaps models): off the caller's event loop.
        scorer = self._scorer
        if scorer is None or not scorer.runner.runner.alive:
            scorer = await asyncio.to_thread(self._live)
        scored = await scorer.ascore(examples, programs)
        self._finished(scorer)
        return scored

    def metrics(self) -> dict[str, Any]:
        scorer = self._scorer
        return scorer.metrics() if scorer is not None else {}

    def __enter__(self) -> ScoringSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
