"""The lean supervisor (the zygote): forks one fresh sandbox per program and polices it.

It runs as its own `python -I` process with a scrubbed environment, started before any model or
dataset is loaded, so a forked sandbox inherits no labels, tokens, CUDA state or sibling data.
It speaks length-prefixed JSON with the runner over one descriptor (`python -m
vprl.executor.sandbox.supervisor FD`) and with each sandbox over two pipes plus a capped output pipe.

It is single-threaded: one selector loop that starts queued tasks in free slots, relays tool
calls to the runner (pausing the program's clock while one is in flight), enforces wall-clock
deadlines with SIGKILL, caps output and result sizes, reaps every process (it is a child
subreaper), and reports exactly one `done` frame per task. Accounting is done here, never taken
from what a sandbox says; nothing a sandbox sends is ever executed or unpickled.

Spawn "clone" (the default) keeps one *spare* per slot: a sandbox made ahead of time, set up up
to the point where it waits, as root with nothing of ours in hand, for its task on its reply pipe
(child.start_init). A task is handed to the slot's spare the moment the slot frees up, so making
the next sandbox overlaps the current program instead of following it. A spare is still one fresh
process tree per program (never reused). Slots free up when their task ends; the namespaces of a
finished tree are released when it is reaped (netns.py says why network namespaces are pooled
and when one may be reused).

Which sandbox it makes (the config's `sandbox`): "full" (the namespaces above), "restricted" (no
namespaces: restricted.py), or "auto", full where the probe finds every required layer and
restricted where only namespaces (and what needs root) are missing.
"""

from __future__ import annotations

import os
import sys

# Single-threaded numerical libraries: a forked child of a multi-threaded process is fragile.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import contextlib  # noqa: E402
import errno  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import selectors  # noqa: E402
import signal  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import deque  # noqa: E402
from typing import Any  # noqa: E402

from vprl.executor.limits import MAX_ERROR, MAX_NAME, MAX_SANDBOX_ERROR  # noqa: E402
from vprl.executor.program import BadReturn, to_plain  # noqa: E402
from vprl.executor.sandbox import framing, restricted, restricted_filter, seccomp, syscalls, uids  # noqa: E402
from vprl.executor.sandbox.child import Limits  # noqa: E402
from vprl.executor.sandbox.ending import Ending  # noqa: E402
from vprl.executor.sandbox.netns import SlotNetworks  # noqa: E402
from vprl.executor.sandbox.outcome import clean, clean_text  # noqa: E402
from vprl.executor.sandbox.probe import LAYERS, probe_layers  # noqa: E402
from vprl.executor.sandbox.spawning import SPARE, SPAWN_MODES, Spawning, Task, check_clone  # noqa: E402

# What programs may import: inside the empty chroot only modules already loaded can be imported.
PRELOAD = (
    *("base64", "binascii", "bisect", "cmath", "collections", "copy", "dataclasses", "datetime", "decimal"),
    *("fractions", "functools", "heapq", "itertools", "json", "math", "operator", "random", "re", "statistics"),
    *("string", "time", "typing", "unicodedata", "numpy", "numpy.linalg", "numpy.random", "numpy.fft"),
    *("encodings.ascii", "encodings.idna", "encodings.latin_1", "encodings.utf_8", "encodings.utf_16"),
    *("encodings.utf_32", "encodings.cp1252", "encodings.unicode_escape", "encodings.raw_unicode_escape"),
    *("vprl.executor.api", "vprl.executor.program"),
)
HOST_MAX_FRAME = 256 << 20
ROOT_PREFIX = "vprl-sandbox-root-"  # + supervisor pid: an empty, read-only directory to chroot into
CHILD_STATUSES = frozenset({"ok", "syntax_error", "runtime_error", "bad_return", "memory_limit", "infra_error"})
RPC_METHODS = frozenset({"call", "pixels", "register"})
NETNS_PER_SLOT = 3


class Supervisor(Spawning, Ending):
    def __init__(
        self,
        host_fd: int,
        slots: int,
        limits: Limits,
        spawn: str = "clone",
        plan: restricted.Plan | None = None,
        uid_bases: list[int] | None = None,
    ) -> None:
        if spawn not in SPAWN_MODES:
            raise ValueError(f"spawn must be one of {SPAWN_MODES}, got {spawn!r}")
        self.host_fd = host_fd
        self.limits = limits
        self.plan = plan  # set: the restricted mode, whose sandboxes are plain forks
        self.spawn = "plain" if plan is not None else spawn
        self.networks = None
        self.free_netns: list[int] = []
        if self.spawn == "clone":
            check_clone()
            # Three per slot: the slot's running tree, its spare, and a finished tree still being torn
            # down (its namespace comes back when it is reaped; with only two, the next spare waits
            # for that, and under load a task often found no spare ready).
            self.networks = SlotNetworks(NETNS_PER_SLOT * slots)
            self.free_netns = list(range(NETNS_PER_SLOT * slots))
        self.spares: dict[int, Task] = {}  # slot -> its spare
        self.spare_failures = 0
        uids.check_slots(slots)
        self.n_slots = slots
        self.free_slots = list(range(slots))
        # Each slot's uid range: claimed for this executor alone where sandboxes change uid (uids.py).
        self.uid_bases = uid_bases if uid_bases is not None else uids.unclaimed(slots)
        if len(self.uid_bases) != slots:
            raise ValueError(f"{len(self.uid_bases)} uid ranges for {slots} slots")
        self.uid_turns: dict[int, int] = {}  # slot -> sandboxes made for it so far (uids.uid_of)
        self.queue: deque[Task] = deque()
        self.tasks: dict[int, Task] = {}  # started, not yet reaped
        self.by_pid: dict[int, Task] = {}
        self.host_reader = framing.FrameReader(HOST_MAX_FRAME)
        self.sel = selectors.DefaultSelector()
        self.closing = False
        self.pid = os.getpid()
        remove_stale_roots()
        self.root = tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{self.pid}-")
        os.chmod(self.root, 0o555)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.sel.register(self.wake_r, selectors.EVENT_READ, self._on_wake)
        self.sel.register(host_fd, selectors.EVENT_READ, self._on_host)

    # -- main loop -------------------------------------------------------------------------------
    def serve(self) -> None:
        try:
            while not self.closing:
                # A spare is made only when nothing else is waiting: forking blocks this loop for
                # about a millisecond, and a result that arrives meanwhile would be charged for it.
                wanted = self._spare_wanted()
                events = self.sel.select(0.0 if wanted is not None else self._select_timeout())
                for key, mask in events:
                    key.data(key.fd, mask)
                self._reap()
                self._check_deadlines()
                self._start_queued()
                if not events and wanted is not None and wanted == self._spare_wanted():
                    self._make_spare(wanted)
        finally:
            self._shutdown()

    def _select_timeout(self) -> float:
        now = time.monotonic()
        waits = [0.5]
        for t in self.tasks.values():
            if not t.finished:
                if t.rpc_since is None:
                    waits.append(t.started + t.timeout + t.rpc_wait - now)
                else:
                    waits.append(t.rpc_since + t.rpc_timeout - now)
        return max(min(waits), 0.0)

    def _on_wake(self, fd: int, mask: int) -> None:
        try:
            while os.read(fd, 4096):
                pass
        except BlockingIOError:
            pass

    # -- runner side -----------------------------------------------------------------------------
    def _send_host(self, frame: dict[str, Any]) -> None:
        framing.send_blocking(self.host_fd, frame)

    def _on_host(self, fd: int, mask: int) -> None:
        data = os.read(fd, 1 << 20)
        if not data:  # the runner is gone: nobody wants the results
            self.closing = True
            return
        for frame in self.host_reader.feed(data):
            op = frame.get("op")
            if op == "run":
                self.queue.append(
                    Task(
                        frame["task"],
                        frame["source"],
                        frame["inputs"],
                        float(frame["timeout"]),
                        float(frame["rpc_timeout"]),
                    )
                )
            elif op == "reply":
                self._deliver_reply(frame["task"], frame["reply"])
            elif op == "kill":  # the runner ends a task early (e.g. it went past its tool-call cap)
                task = self.tasks.get(frame["task"])
                if task is not None:
                    self._finish(task, str(frame["status"]), str(frame.get("error", ""))[:MAX_ERROR])
            elif op == "shutdown":
                self.closing = True
            else:
                raise ValueError(f"unknown op from the runner: {op!r}")

    def _deliver_reply(self, task_id: int, reply: dict[str, Any]) -> None:
        task = self.tasks.get(task_id)
        if task is None or task.finished or task.rpc_since is None:
            return  # the task ended while its call was in flight
        task.rpc_wait += time.monotonic() - task.rpc_since
        task.rpc_since = None
        task.wbuf += framing.encode(reply)
        self._flush_reply(task)

    def _flush_reply(self, task: Task) -> None:
        fd = task.fds.get("rep")
        if fd is None:
            task.wbuf.clear()
            return
        try:
            while task.wbuf:
                n = os.write(fd, task.wbuf)
                del task.wbuf[:n]
        except BlockingIOError:
            pass
        except OSError:  # the program closed its end; it will not read the reply anyway
            task.wbuf.clear()
        events = selectors.EVENT_WRITE if task.wbuf else 0
        self._set_events(fd, events, lambda fd, mask, t=task: self._flush_reply(t))

    def _set_events(self, fd: int, events: int, callback) -> None:
        registered = fd in self.sel.get_map()
        if events and not registered:
            self.sel.register(fd, events, callback)
        elif not events and registered:
            self.sel.unregister(fd)

    # -- a sandbox's channels --------------------------------------------------------------------
    def _on_output(self, task: Task) -> None:
        if "out" not in task.fds:  # closed earlier in this same select round
            return
        try:
            data = os.read(task.fds["out"], 65536)
        except BlockingIOError:
            return
        if not data:
            self._close_fd(task, "out")
            return
        task.out_bytes += len(data)
        room = self.limits.max_output - len(task.stdout)
        task.stdout += data[: max(room, 0)]
        if task.out_bytes > self.limits.max_output:
            self._finish(task, "output_limit", f"the program printed more than {self.limits.max_output} bytes")

    def _on_request(self, task: Task) -> None:
        if "req" not in task.fds:
            return
        try:
            data = os.read(task.fds["req"], 1 << 20)
        except BlockingIOError:
            return
        if not data:
            self._close_fd(task, "req")  # the program is gone; its exit status will classify it
            return
        for frame in task.reader.feed(data):
            if task.finished:
                return
            self._on_frame(task, frame)
        error = task.reader.error
        if error is not None and not task.finished:
            if isinstance(error, framing.FrameTooLarge):
                self._finish(task, "output_limit" if task.ready else "infra_error", str(error))
            else:
                self._finish(task, "killed" if task.ready else "infra_error", f"protocol violation: {error}")

    def _on_frame(self, task: Task, frame: Any) -> None:
        op = frame.get("op") if isinstance(frame, dict) else None
        if not task.ready:
            if op == "ready" and task.id != SPARE:
                task.ready = True
                self.spare_failures = 0
            else:
                self._finish(task, "infra_error", f"sandbox sent {op!r} before it was ready")
            return
        if op == "rpc" and frame.get("method") in RPC_METHODS and task.rpc_since is None:
            task.rpc_since = time.monotonic()
            self._send_host({"op": "rpc", "task": task.id, "request": frame})
        elif op == "result":
            self._finish_with_result(task, frame)
        else:
            self._finish(
                task, "killed", f"protocol violation: unexpected {str(op)[:MAX_NAME]!r} message from the program"
            )

    def _finish_with_result(self, task: Task, frame: dict[str, Any]) -> None:
        status = frame.get("status")
        if status not in CHILD_STATUSES:
            self._finish(task, "killed", f"protocol violation: status {str(status)[:MAX_NAME]!r}")
            return
        if len(framing.encode(frame)) > self.limits.max_result:
            self._finish(task, "output_limit", f"the result is larger than {self.limits.max_result} bytes")
            return
        error = frame.get("error")
        error = clean_text(error)[:MAX_SANDBOX_ERROR] if isinstance(error, str) else None
        try:
            answer = clean(to_plain(frame.get("answer")))
        except (BadReturn, RecursionError) as exc:
            self._finish(task, "bad_return", str(exc))
            return
        self._finish(task, status, error, answer, from_program=True)

    def _close_fd(self, task: Task, name: str) -> None:
        fd = task.fds.pop(name, None)
        if fd is not None:
            if fd in self.sel.get_map():
                self.sel.unregister(fd)
            os.close(fd)


def remove_stale_roots() -> None:
    """Remove the empty roots of supervisors that were killed before they could clean up."""
    folder = tempfile.gettempdir()
    for name in os.listdir(folder):
        if name.startswith(ROOT_PREFIX):
            pid = name[len(ROOT_PREFIX) :].split("-")[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                with contextlib.suppress(OSError):  # not empty or not ours: leave it
                    os.rmdir(os.path.join(folder, name))


def main(argv: list[str]) -> int:
    host_fd = int(argv[1])
    syscalls.set_pdeathsig(signal.SIGKILL)  # the runner died: so do we, and with us every sandbox
    syscalls.set_child_subreaper()
    os.set_blocking(host_fd, True)
    for name in PRELOAD:
        importlib.import_module(name)
    config = framing.recv_blocking(host_fd, 1 << 20)
    limits = Limits.from_json(config["limits"])
    required = tuple(config.get("require_layers", LAYERS))
    asked = str(config.get("sandbox", "full"))
    layers = {**probe_layers(), **restricted.probe_layers()}
    isolation, fatal = restricted.choose(asked, layers, required)
    if fatal is not None:
        framing.send_blocking(host_fd, {"op": "fatal", "message": fatal})
        return 2
    slots, spawn = int(config["slots"]), str(config.get("spawn", "clone"))
    claim = None
    if layers["uid"] == "ok":  # sandboxes switch uid: to uids no other executor here uses
        try:
            claim = uids.Claim(slots)
        except (OSError, ValueError) as exc:
            framing.send_blocking(host_fd, {"op": "fatal", "message": str(exc)})
            return 2
    bases = claim.bases if claim is not None else None
    plan, notice = None, None
    if isolation == "restricted":
        plan = restricted.plan(layers)
        notice = restricted.notice(asked, layers, plan)
        seccomp.arm(restricted_filter.build_rules_bpf())
    else:
        seccomp.arm(seccomp.build_bpf() if layers["seccomp"] == "ok" else None)  # loaded by every sandbox program
    try:
        supervisor = Supervisor(host_fd, slots, limits, spawn, plan, bases)
    except OSError as exc:
        if spawn != "clone" or plan is not None:
            raise
        print(f"supervisor: spawn 'clone' is not available ({exc}); falling back to 'fork'", file=sys.stderr)
        supervisor = Supervisor(host_fd, slots, limits, "fork", uid_bases=bases)
    # Objects loaded so far are shared with every sandbox; frozen, the collector never walks (and so
    # never copies on write) their pages in a child.
    gc.freeze()
    hello = {
        "op": "hello",
        "pid": os.getpid(),
        "layers": layers,
        "root": supervisor.root,
        "spawn": supervisor.spawn,
        "isolation": isolation,
        "notice": notice,
    }
    framing.send_blocking(host_fd, hello)
    try:
        supervisor.serve()
    except OSError as exc:
        if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
            raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
