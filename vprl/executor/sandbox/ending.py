"""Ending a task: deadlines, the one report per task, reaping, shutdown.

`Ending` is a part of `Supervisor` (supervisor.py), split out to keep each file to one job; it
uses the supervisor's slots, selector and task tables. A task ends exactly once (`_finish`): its
tree is SIGKILLed and its channels closed, then it is reported to the runner; the tree is reaped
later (`_reap`), and a tree that ended without a result is classified by its exit status.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import Any

from vprl.executor.limits import MAX_STDOUT
from vprl.executor.sandbox.outcome import classify_exit, setup_reason
from vprl.executor.sandbox.spawning import SPARE, WITH_SPARES, Task


class Ending:
    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for task in list(self.tasks.values()):
            if task.finished:
                continue
            if task.rpc_since is not None:
                if now - task.rpc_since > task.rpc_timeout:
                    self._finish(task, "infra_error", f"no answer from the tool host in {task.rpc_timeout:.1f} s")
            elif now - task.started - task.rpc_wait > task.timeout:
                self._finish(task, "timeout", f"the program ran longer than {task.timeout:g} s")

    def _finish(
        self, task: Task, status: str, error: str | None = None, answer: Any = None, from_program: bool = False
    ) -> None:
        if task.finished:
            return
        task.finished = True
        with contextlib.suppress(ProcessLookupError):  # not yet reaped, so the pid cannot have been reused
            os.kill(task.pid, signal.SIGKILL)
        if "out" in task.fds:
            self._on_output_drain(task)
        for name in list(task.fds):
            self._close_fd(task, name)
        task.wbuf.clear()
        if task.id == SPARE:  # a spare misbehaved before it had a task (or we shut down): nothing to report
            if self.spares.get(task.slot) is task:
                del self.spares[task.slot]
            return
        if self.spawn in WITH_SPARES:
            # Its tree is SIGKILLed: the slot's next program may start in the slot's spare now; this
            # tree's network namespace comes back only when the tree is reaped.
            self.free_slots.append(task.slot)
        self._report(task, status, error, answer, from_program)

    def _on_output_drain(self, task: Task) -> None:
        fd = task.fds["out"]
        try:
            while len(task.stdout) < self.limits.max_output and (data := os.read(fd, 65536)):
                task.stdout += data[: self.limits.max_output - len(task.stdout)]
        except BlockingIOError:
            pass

    def _report(
        self, task: Task, status: str, error: str | None, answer: Any = None, from_program: bool = False
    ) -> None:
        duration = time.monotonic() - task.started if task.started else 0.0
        self._send_host(
            {
                "op": "done",
                "task": task.id,
                "status": status,
                "answer": answer,
                "error": error,
                "stdout": task.stdout.decode("utf-8", "replace")[:MAX_STDOUT],
                "duration_s": round(duration, 6),
                "rpc_wait_s": round(task.rpc_wait, 6),
                "from_program": from_program,  # the status is the program's own claim (checked by the runner)
            }
        )

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            task = self.by_pid.pop(pid, None)
            if task is None:
                continue  # an orphaned namespace init handed to us as subreaper
            if not task.ready and "out" in task.fds:
                self._on_output_drain(task)  # its reason for failing the set-up, if it gave one
            if task.id == SPARE:
                if self.spares.get(task.slot) is task:
                    del self.spares[task.slot]
                if not self.closing:
                    self.spare_failures += 1
                    reason = setup_reason(task.stdout)
                    if reason and self.spare_failures == 1:  # no task to report it on: say it once
                        print(f"supervisor: a spare sandbox failed its set-up: {reason}", file=sys.stderr)
            if not task.finished:
                if "req" in task.fds:  # a result may still sit in the pipe
                    self._on_request(task)
                if not task.finished:
                    self._finish(task, *classify_exit(os.waitstatus_to_exitcode(status), task.ready, task.stdout))
            if task.netns >= 0:
                self.free_netns.append(task.netns)
            if task.id != SPARE:
                self.tasks.pop(task.id, None)
                if self.spawn == "fork":
                    self.free_slots.append(task.slot)

    def _shutdown(self) -> None:
        self.closing = True
        for spare in list(self.spares.values()):
            self._finish(spare, "infra_error")
        for task in list(self.tasks.values()):
            if not task.finished:
                self._finish(task, "infra_error", "the executor shut down")
        deadline = time.monotonic() + 5
        while self.by_pid and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.005)
        if self.networks is not None:
            self.networks.close()
        try:
            os.rmdir(self.root)
        except OSError as exc:
            print(f"supervisor: could not remove {self.root}: {exc}", file=sys.stderr)
