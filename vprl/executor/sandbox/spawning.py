"""Starting sandboxes: the supervisor's half of the two process trees of child.py.

Spawn "fork" makes a sandbox for a task when a slot is free. Spawn "clone" keeps a *spare* per
slot, made ahead of time while the supervisor has nothing else to do, and hands the next task to
it (`_hand_over`); see supervisor.py. The restricted mode (no namespaces) keeps spares too, made
with a plain fork (spawn "plain", never asked for: the mode implies it). `Spawning` is a part of
`Supervisor`, split out to keep each file to one job; it uses the supervisor's slots, selector
and task tables.
"""

from __future__ import annotations

import os
import selectors
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from vprl.executor.sandbox import framing, syscalls
from vprl.executor.sandbox.child import start_init, start_restricted, start_sandbox
from vprl.executor.sandbox.uids import uid_of

SPAWN_MODES = ("clone", "fork")  # see child.py for the two process trees
WITH_SPARES = ("clone", "plain")  # "plain": the restricted mode's, a fork without namespaces
# New namespaces of every sandbox; with spawn "clone" the network one comes from a pool (netns.py).
CLONE_FLAGS = syscalls.CLONE_NEWPID | syscalls.CLONE_NEWNS | syscalls.CLONE_NEWIPC | syscalls.CLONE_NEWUTS
SPARE = -1  # the id of a sandbox made ahead of its task
MAX_SPARE_FAILURES = 3  # spares that die before getting a task, in a row, before we stop making them ahead


@dataclass
class Task:
    id: int
    source: str
    inputs: dict[str, Any]
    timeout: float
    rpc_timeout: float
    slot: int = -1
    pid: int = 0
    started: float = 0.0
    fds: dict[str, int] = field(default_factory=dict)  # out, req (we read), rep (we write)
    reader: framing.FrameReader | None = None
    stdout: bytearray = field(default_factory=bytearray)
    out_bytes: int = 0
    ready: bool = False
    rpc_since: float | None = None
    rpc_wait: float = 0.0
    wbuf: bytearray = field(default_factory=bytearray)
    finished: bool = False
    netns: int = -1  # spawn "clone": which pooled network namespace the tree is in


class Spawning:
    def _start_queued(self) -> None:
        if self.spawn in WITH_SPARES:
            self._start_queued_clone()
            return
        while self.queue and self.free_slots and not self.closing:
            task = self.queue.popleft()
            task.slot = self.free_slots.pop()
            try:
                self._fork(task)
            except OSError as exc:
                self.free_slots.append(task.slot)
                self._report(task, "infra_error", f"sandbox fork failed: {exc}")

    def _start_queued_clone(self) -> None:
        while self.queue and self.free_slots and not self.closing:
            with_spare = [slot for slot in self.free_slots if slot in self.spares]
            slot = with_spare[0] if with_spare else self.free_slots[0]
            sandbox = self.spares.pop(slot, None)
            if sandbox is None:
                if self.networks is not None and not self.free_netns:
                    break  # every namespace is held by a tree that is still dying: wait for its reap
                try:
                    sandbox = self._spawn(slot)
                except OSError as exc:
                    self._report(self.queue.popleft(), "infra_error", f"sandbox fork failed: {exc}")
                    continue
            self.free_slots.remove(slot)
            self._hand_over(sandbox, self.queue.popleft())

    def _spare_wanted(self) -> int | None:
        """The slot that should get a spare now, if any."""
        if self.spawn not in WITH_SPARES or self.closing or self.spare_failures >= MAX_SPARE_FAILURES:
            return None
        if self.networks is not None and not self.free_netns:
            return None
        return next((slot for slot in range(self.n_slots) if slot not in self.spares), None)

    def _make_spare(self, slot: int) -> None:
        try:
            self.spares[slot] = self._spawn(slot)
        except OSError as exc:
            self.spare_failures += 1
            print(f"supervisor: could not make a spare sandbox: {exc}", file=sys.stderr)

    def _spawn(self, slot: int) -> Task:
        """A sandbox for `slot` whose task comes later (`_hand_over`)."""
        spare = Task(SPARE, "", {}, 0.0, 0.0, slot=slot)
        out_r, out_w = os.pipe()
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        child_fds = (out_w, req_w, rep_r)
        netns = self.free_netns[-1] if self.networks is not None else -1
        uid = self._next_uid(slot)
        try:
            pid = os.fork() if self.plan is not None else syscalls.fork_into_namespaces(CLONE_FLAGS)
        except OSError:
            for fd in (out_r, req_r, rep_w, *child_fds):
                os.close(fd)
            raise
        if pid == 0:  # pragma: no cover - the child never returns
            if self.plan is not None:
                start_restricted(uid, child_fds, self.root, self.limits, self.plan, self.pid, self._forget)
            else:
                enter = lambda: self.networks.enter(netns)  # noqa: E731
                start_init(uid, child_fds, self.root, self.limits, enter, self._forget)
            os._exit(1)
        if netns >= 0:
            self.free_netns.pop()
        spare.netns = netns
        self._adopt(spare, pid, child_fds, out_r, req_r, rep_w)
        return spare

    def _hand_over(self, sandbox: Task, task: Task) -> None:
        sandbox.id, sandbox.timeout, sandbox.rpc_timeout = task.id, task.timeout, task.rpc_timeout
        sandbox.started = time.monotonic()
        self.tasks[task.id] = sandbox
        sandbox.wbuf += framing.encode({"source": task.source, "inputs": task.inputs, "timeout": task.timeout})
        self._flush_reply(sandbox)

    def _fork(self, task: Task) -> None:
        out_r, out_w = os.pipe()
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        payload = {"source": task.source, "inputs": task.inputs, "timeout": task.timeout}
        child_fds = (out_w, req_w, rep_r)
        uid = self._next_uid(task.slot)
        try:
            pid = os.fork()
        except OSError:
            for fd in (out_r, req_r, rep_w, *child_fds):
                os.close(fd)
            raise
        if pid == 0:  # pragma: no cover - the child never returns
            start_sandbox(uid, payload, child_fds, self.root, self.limits, self.pid, self._forget)
            os._exit(1)
        task.started = time.monotonic()
        task.source = ""  # the child has its copy; keep the supervisor's memory small
        self.tasks[task.id] = task
        self._adopt(task, pid, child_fds, out_r, req_r, rep_w)

    def _next_uid(self, slot: int) -> int:
        turn = self.uid_turns.get(slot, 0)
        self.uid_turns[slot] = turn + 1
        return uid_of(self.uid_bases[slot], turn)

    def _adopt(self, task: Task, pid: int, child_fds, out_r: int, req_r: int, rep_w: int) -> None:
        for fd in child_fds:
            os.close(fd)
        for fd in (out_r, req_r, rep_w):
            os.set_blocking(fd, False)
        task.pid = pid
        task.fds = {"out": out_r, "req": req_r, "rep": rep_w}
        task.reader = framing.FrameReader(self.limits.max_request)
        self.by_pid[pid] = task
        self.sel.register(out_r, selectors.EVENT_READ, lambda fd, mask, t=task: self._on_output(t))
        self.sel.register(req_r, selectors.EVENT_READ, lambda fd, mask, t=task: self._on_request(t))

    def _forget(self) -> None:
        """In a sandbox: drop the supervisor's state from the copied memory before the program runs."""
        self.queue.clear()
        self.tasks.clear()
        self.by_pid.clear()
        self.spares.clear()
        self.host_reader = framing.FrameReader(0)


def check_clone() -> None:
    """Fail now, not per program, where clone with namespace flags is blocked (e.g. by seccomp)."""
    pid = syscalls.fork_into_namespaces(CLONE_FLAGS)
    if pid == 0:  # pragma: no cover - runs in the child
        os._exit(0 if os.getpid() == 1 else 1)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise OSError("clone into a new pid namespace did not make the child its PID 1")
