"""Inside a sandbox: the isolation set-up after fork, and running the program to its one result frame
(the program's side of the channel is channel.py).

With spawn "clone" (the default) the program is PID 1 of its own pid namespace, cloned straight
into it; spawn "fork" adds an outer process and an init. The trees, and what being init changes
for the program: docs/design-notes.md#sandbox-process-tree. The restricted mode (no namespaces,
`start_restricted`) is one plain forked process: docs/design-notes.md#the-sandbox-without-namespaces.

The supervisor kills the program (or, with "fork", `outer`, whose death kills `init` by
PDEATHSIG), and the death of a namespace's init makes the kernel kill every process left in it.
Descriptors are moved to fixed numbers and everything else is closed *right after fork*: without
exec, O_CLOEXEC protects nothing, and an inherited sibling channel would let a program forge
another program's result.
"""

from __future__ import annotations

import _imp
import contextlib
import fcntl
import io
import math
import os
import resource
import signal
import sys
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from vprl.executor.api import SourceImage, bind_client
from vprl.executor.program import execute_program
from vprl.executor.sandbox import framing, landlock, restricted_filter, seccomp, syscalls
from vprl.executor.sandbox.channel import (
    FROM_SUPERVISOR_FD,
    STDOUT_FD,
    TO_SUPERVISOR_FD,
    ChannelClient,
    decode_inputs,
    restore_builtins,
)
from vprl.executor.sandbox.outcome import SETUP_FAILED
from vprl.executor.tools.errors import ToolUnavailable
from vprl.paths import IMPORT_ROOT

if TYPE_CHECKING:
    from vprl.executor.sandbox.restricted import Plan

MAX_TASK = 256 << 20  # bytes of the task frame a spare receives (the supervisor's own cap on runner frames)

# Captured before any program runs: a program may rebind `os._exit` for everyone in its process.
_exit = os._exit


@dataclass(frozen=True)
class Limits:
    """Per-program limits; travels to the supervisor as JSON."""

    memory_mb: int = 1024  # RLIMIT_AS
    nproc: int = 16  # RLIMIT_NPROC, per sandbox uid
    nofile: int = 64
    stack_mb: int = 8
    max_output: int = 64 * 1024  # bytes of stdout+stderr before the program is killed (output_limit)
    max_result: int = 1 << 20  # bytes of the result frame
    max_request: int = 32 << 20  # bytes of one rpc request (a registered image is the big one)
    max_reply: int = 64 << 20  # bytes of one rpc reply (pixels)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Limits:
        return cls(**row)


def start_sandbox(
    uid: int,
    task: dict[str, Any],
    fds: tuple[int, int, int],
    root: str,
    limits: Limits,
    supervisor_pid: int,
    forget,
) -> None:
    """Runs in the child right after the supervisor's fork; never returns.

    `fds` are the child's ends: (stdout pipe write end, request pipe write end, reply pipe read
    end). `forget` drops the supervisor's state from this copy of its memory.
    """
    try:
        # The supervisor's SIGCHLD wake-up descriptor may share a number with our channel.
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _fixed_descriptors(*fds)
        os.setsid()
        syscalls.set_pdeathsig(signal.SIGKILL)
        if os.getppid() != supervisor_pid:  # the supervisor died before PDEATHSIG was armed
            _exit(1)
        flags = 0
        for bit in syscalls.NAMESPACES.values():
            flags |= bit
        syscalls.unshare(flags)
        init = os.fork()
        if init:
            _close_channel()
            _exit(_wait_exit_code(init))
        # PID 1 of the new namespace.
        syscalls.set_pdeathsig(signal.SIGKILL)
        _init_then_program(root)
        # PID 2: the program.
        forget()
        _drop_privileges(uid, task["timeout"], limits)
    except BaseException as exc:  # noqa: BLE001 — any set-up failure: exit before "ready", saying why
        _setup_failed(exc)
    _run(task, limits)


def _setup_failed(exc: BaseException) -> NoReturn:
    """Exit before "ready" (the supervisor reports infra_error) with one line on fd 2 saying which
    exception stopped the set-up: the supervisor puts it into the error, so a node where one step
    fails (a kernel that refuses a limit, a sandbox uid) says so instead of failing every program
    unexplained. Before the descriptors are fixed fd 2 is the supervisor's stderr; after, the output
    pipe. No program code has run yet, so nothing of a program's can be in the line."""
    with contextlib.suppress(OSError):
        os.write(2, f"{SETUP_FAILED}{type(exc).__name__}: {exc}\n".encode("utf-8", "replace")[:2000])
    _exit(1)


def _enter_root(root: str) -> None:
    os.chroot(root)
    os.chdir("/")


def _init_then_program(root: str) -> None:
    """As PID 1 of the sandbox: enter the empty root, fork the program (PID 2), and stay behind as
    its reaper until it exits. Returns only in the program process."""
    _enter_root(root)
    program = os.fork()
    if program:
        _close_channel()
        _exit(_wait_exit_code(program, reap_all=True))


def start_init(
    uid: int,
    fds: tuple[int, int, int],
    root: str,
    limits: Limits,
    enter_network,
    forget,
) -> None:
    """Spawn "clone": runs in the child of `syscalls.fork_into_namespaces`, already PID 1 of fresh
    pid/mount/ipc/uts namespaces, and is the program process; never returns. `enter_network()` joins the network namespace
    the supervisor picked (it needs a descriptor that `_fixed_descriptors` closes, so it goes first).

    The sandbox is made before its program is known (a spare, see supervisor.py): it waits,
    still root but already chrooted and holding nothing of the supervisor's state,
    for one task frame on its reply pipe; only then does it drop to its uid (uids.py) and limits and
    say "ready".

    `getppid()` is 0 here (the supervisor is outside the pid namespace), so the "supervisor died
    before PDEATHSIG was armed" race cannot be checked by pid; it is harmless instead: such an
    orphan reads end-of-file where its task should be and exits before any program code runs.
    """
    try:
        signal.set_wakeup_fd(-1)  # the supervisor's wake-up descriptor may share a number with our channel
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        syscalls.set_pdeathsig(signal.SIGKILL)
        enter_network()
        _fixed_descriptors(*fds)
        os.setsid()
        _enter_root(root)
        forget()
        _settle()
        _warm_up(limits)
        task = framing.recv_blocking(FROM_SUPERVISOR_FD, MAX_TASK)
        _limit_and_become(uid, task["timeout"], limits)
    except BaseException as exc:  # noqa: BLE001 — any set-up failure: exit before "ready", saying why
        _setup_failed(exc)
    _run(task, limits)


def start_restricted(
    uid: int,
    fds: tuple[int, int, int],
    root: str,
    limits: Limits,
    plan: Plan,
    supervisor_pid: int,
    forget,
) -> None:
    """The restricted mode (no namespaces): runs in a plain fork of the supervisor, which is the
    program process; never returns. Like `start_init`'s it is a spare that waits for its task, with
    everything that does not depend on the task done first: the empty root (chroot as root, else
    just the working directory), the shared filter, Landlock, and its own pid filter (loaded last,
    once PDEATHSIG is re-armed, since the pid filter denies that prctl).
    docs/design-notes.md#the-sandbox-without-namespaces."""
    try:
        signal.set_wakeup_fd(-1)  # the supervisor's wake-up descriptor may share a number with our channel
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        syscalls.set_pdeathsig(signal.SIGKILL)
        if os.getppid() != supervisor_pid:  # the supervisor died before PDEATHSIG was armed
            _exit(1)
        _fixed_descriptors(*fds)
        os.setsid()
        if plan.chroot:
            _enter_root(root)
        else:
            os.chdir(root)  # relative paths then name nothing
        if not plan.setuid:
            syscalls.drop_capabilities()  # root that cannot change uid may hold some (CAP_SYS_RESOURCE, ...)
        forget()
        _settle()
        if plan.landlock_abi:
            landlock.deny_everything(plan.landlock_abi)
        own = seccomp.Program(restricted_filter.pid_filter(os.getpid(), plan.numbers))
        _warm_up(limits)
        if not plan.chroot:
            sys.meta_path.insert(0, _LoadedOnly)
        task = framing.recv_blocking(FROM_SUPERVISOR_FD, MAX_TASK)
        _set_limits(task["timeout"], limits, nproc=plan.setuid)
        if plan.setuid:
            _become(uid)
        own.load()
    except BaseException as exc:  # noqa: BLE001 — any set-up failure: exit before "ready", saying why
        _setup_failed(exc)
    _run(task, limits)


class _LoadedOnly:
    """Without chroot, importing a module that is not loaded reaches Landlock's wall, whose
    PermissionError names the host file it kept the program from (the interpreter's install path).
    Under chroot that module is simply missing: answer the same here, before any file is tried.
    Built-in and frozen modules need no file and import as before."""

    @staticmethod
    def find_spec(name: str, path=None, target=None):
        if name in sys.builtin_module_names or _imp.is_frozen(name):
            return None
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def _fixed_descriptors(out_w: int, req_w: int, rep_r: int) -> None:
    # Move our ends above the fixed range first, so dup2 into 0..4 cannot clobber one of them.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (out_w, req_w, rep_r)]
    devnull = fcntl.fcntl(os.open("/dev/null", os.O_RDONLY), fcntl.F_DUPFD, 10)
    os.dup2(devnull, 0)
    os.dup2(high[0], STDOUT_FD)
    os.dup2(high[0], 2)
    os.dup2(high[1], TO_SUPERVISOR_FD)
    os.dup2(high[2], FROM_SUPERVISOR_FD)
    os.closerange(FROM_SUPERVISOR_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _close_channel() -> None:
    # The waiting parents must not hold the channel open: end of file tells the supervisor that
    # the program is gone.
    os.closerange(0, FROM_SUPERVISOR_FD + 1)


def _wait_exit_code(pid: int, reap_all: bool = False) -> int:
    """Wait for `pid` (reaping orphans too as PID 1) and turn its end into an exit code."""
    while True:
        done, status = os.waitpid(-1 if reap_all else pid, 0)
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else min(code, 127)


def _drop_privileges(uid: int, timeout: float, limits: Limits) -> None:
    _settle()
    _limit_and_become(uid, timeout, limits)


def _settle() -> None:
    """The part of dropping privileges that does not depend on the task (a spare does it early)."""
    syscalls.set_no_new_privs()
    os.environ.clear()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    # The syscall filter the supervisor built (seccomp.py), after NO_NEW_PRIVS. Nothing the sandbox
    # still does after this (rlimits, setgroups/setgid/setuid, PDEATHSIG) is on its denylist, and
    # loading it here takes it off the program's clock: a spare does it while it waits.
    seccomp.load_armed()


def _limit_and_become(uid: int, timeout: float, limits: Limits) -> None:
    _set_limits(timeout, limits)
    _become(uid)


def _set_limits(timeout: float, limits: Limits, nproc: bool = True) -> None:
    cpu = math.ceil(timeout) + 1  # a backstop only: the supervisor enforces the wall deadline
    settings = {
        resource.RLIMIT_AS: limits.memory_mb << 20,
        resource.RLIMIT_NOFILE: limits.nofile,
        resource.RLIMIT_FSIZE: 0,  # also caps memfd/tmpfs writes, which RLIMIT_AS does not see
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_STACK: limits.stack_mb << 20,
    }
    # RLIMIT_NPROC counts every task of the uid, system-wide: right for a slot's own uid, but with
    # the supervisor's uid (the restricted mode when not root) it would count the trainer's threads.
    if nproc:
        settings[resource.RLIMIT_NPROC] = limits.nproc
    for which, value in settings.items():
        resource.setrlimit(which, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))


def _become(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    # setuid() clears PDEATHSIG (the kernel resets it on a credential change): arm it again.
    syscalls.set_pdeathsig(signal.SIGKILL)


# Where this interpreter and vprl live on the host, longest first: the interpreter's own messages
# name module files by them (ImportError "cannot import name 'x' from 'os' (/.../os.py)"), which
# tells a program the host's layout. The error says "<python>/..." or "<vprl>/..." instead.
_HOST_PREFIXES = sorted(
    {
        **{prefix: "<python>" for prefix in (sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix)},
        str(IMPORT_ROOT): "<vprl>",
    }.items(),
    key=lambda item: -len(item[0]),
)


def _without_host_paths(error: str | None) -> str | None:
    if error:
        for prefix, name in _HOST_PREFIXES:
            if prefix not in ("", "/"):
                error = error.replace(prefix, name)
    return error


WARM_UP = "def execute_command(image):\n    return [ImagePatch(image).width, 'a', 0.5, None, True, {'k': 1}]\n"


class _Refuse:
    def call(self, tool, image, box, args):
        raise ToolUnavailable("warm-up")

    def pixels(self, image):
        raise ToolUnavailable("warm-up")

    def register_pixels(self, pixels):
        raise ToolUnavailable("warm-up")


def _warm_up(limits: Limits) -> None:
    """In a spare, while it waits: run a constant program of ours through the same path a task
    takes, so the memory pages that path writes (reference counts of the interpreter's and the
    API's objects) are copied from the supervisor now, not on the clock of the next program.
    It runs no input of anyone's and leaves nothing behind but those private pages."""
    out = io.TextIOWrapper(io.FileIO(STDOUT_FD, "w", closefd=False), encoding="utf-8", errors="replace")
    ChannelClient(limits.max_reply)
    with bind_client(_Refuse()):
        outcome = execute_program(WARM_UP, {"image": SourceImage("0" * 20, 8, 8)})
    framing.encode({"op": "result", "status": outcome.status, "answer": outcome.answer, "error": outcome.error})
    del out  # not flushed: nothing was written


def _run(task: dict[str, Any], limits: Limits) -> None:
    """Run the program and send exactly one result frame, then leave without cleanup."""
    try:
        framing.send_blocking(TO_SUPERVISOR_FD, {"op": "ready"})
        out = io.TextIOWrapper(io.FileIO(STDOUT_FD, "w", closefd=False), encoding="utf-8", errors="replace")
        sys.stdout = sys.stderr = out
        client = ChannelClient(limits.max_reply)
        with bind_client(client):
            outcome = execute_program(task["source"], decode_inputs(task["inputs"]))
        status, error = outcome.status, _without_host_paths(outcome.error)
        if status == "runtime_error" and (error or "").split(":", 1)[0].endswith("MemoryError"):
            status = "memory_limit"
        restore_builtins()
        # A closed or broken stdout is the program's doing; the result still goes.
        with contextlib.suppress(BaseException):
            out.flush()
        framing.send_blocking(
            TO_SUPERVISOR_FD, {"op": "result", "status": status, "answer": outcome.answer, "error": error}
        )
    except BaseException:  # noqa: BLE001 — no result frame: the supervisor classifies the exit
        _exit(3)
    _exit(0)
