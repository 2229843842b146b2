"""The hostile suite on a node without namespaces, as a separate process; tests/test_hostile_restricted.py
runs it and checks what it wrote.

    python tests/restricted_suite.py CONDITION SANDBOX OUT.json

CONDITION is a kind of node (tests/node_kinds.py), made from this machine for this process and
everything it starts, before the executor starts.

An optional fourth argument names the probes to run (comma-separated), instead of all of them.

It writes what the executor chose, the lines it logged, every probe's result (tests/hostile_probes.py
and `extra_probes` below), the answer of a normal program after the suite, and the processes of
ours still alive after the executor closed.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostile_probes import CLONE_CHILD_EXITS, MAX_RPCS, PROBES, TIMEOUT, source_of  # noqa: E402
from node_kinds import become  # noqa: E402
from probe_kit import K, P, errno_of  # noqa: E402
from signal_probes import sigio_trick, signal_owner_probes  # noqa: E402
from test_sandbox import SECRET_ANSWER, SECRET_ENV, make_world  # noqa: E402

from vprl.executor.runner import RunnerConfig, SyncRunner  # noqa: E402
from vprl.executor.sandbox import seccomp  # noqa: E402
from vprl.executor.sandbox.connection import SandboxUnavailable  # noqa: E402

NORMAL = (
    "def execute_command(image):\n    return ImagePatch(image).find('cat')[0].simple_query('what color is the cat?')\n"
)
LABELS = "labels.json"  # in the world's folder, holding the secret answer
RETURN_ERRNO = "    return ctypes.get_errno() if r == -1 else ['succeeded', r]"
# Run before any probe, harmless even where it gets through (signal 0 only asks whether a pid can be
# signalled): the probes below would kill or renice real processes of this uid if the filter let them.
CANARY = """
def execute_command(image):
    import os
    out = []
    for target in (-1, os.getppid(), {runner_pid}):
        try:
            os.kill(target, 0)
            out.append("signalled")
        except PermissionError:
            out.append("denied")
    return out
"""


def extra_probes(runner_pid: int, labels: str) -> list:
    """What only a namespace-free sandbox has to stop: the trainer's uid and processes in reach."""
    nr = seccomp.syscall_number
    return [
        P(
            "kill_the_runner",
            "restricted",
            f"    import os\n    os.kill({runner_pid}, 9)\n    return 1",
            "runtime_error",
        ),
        P(
            "kill_the_runner_group",
            "restricted",
            f"    import os\n    os.killpg(os.getpgid({runner_pid}), 9)\n    return 1",
            "runtime_error",
        ),
        P(
            "prlimit_the_supervisor",
            "restricted",
            "    import os, resource\n    resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (0, 0))\n    return 1",
            "runtime_error",
        ),
        P(
            "pin_the_supervisor",
            "restricted",
            "    import os\n    os.sched_setaffinity(os.getppid(), {0})\n    return 1",
            "runtime_error",
        ),
        P(
            "renice_the_runner",
            "restricted",
            f"    import os\n    os.setpriority(os.PRIO_PROCESS, {runner_pid}, 19)\n    return 1",
            "runtime_error",
        ),
        P(
            "raise_own_limits",
            "restricted",
            "    import resource\n    inf = resource.RLIM_INFINITY\n    resource.setrlimit(resource.RLIMIT_AS, (inf, inf))\n"
            "    return bytearray(8 << 30) and 1",
            "runtime_error",
        ),
        P("read_the_labels", "restricted", f"    return open({labels!r}).read()", "runtime_error"),
        P(
            "read_runner_environ",
            "restricted",
            f"    return open('/proc/{runner_pid}/environ').read()",
            "runtime_error",
        ),
        P(
            "read_runner_memory",
            "restricted",
            f"    f = open('/proc/{runner_pid}/mem', 'rb')\n    return f.read(16).hex()",
            "runtime_error",
        ),
        P(
            "chmod_the_labels",
            "restricted",
            f"    import os\n    os.chmod({labels!r}, 0o777)\n    return 1",
            "runtime_error",
        ),
        P(
            "utime_the_labels",
            "restricted",
            f"    import os\n    os.utime({labels!r}, (0, 0))\n    return 1",
            "runtime_error",
        ),
        P(
            "signal_itself",
            "restricted",
            "    import os, signal\n    got = []\n    signal.signal(signal.SIGUSR1, lambda *a: got.append(1))\n"
            "    os.kill(os.getpid(), signal.SIGUSR1)\n    signal.raise_signal(signal.SIGUSR1)\n    return len(got)",
            "ok",
            lambda r: r.answer == 2,
        ),
        P(
            "thread_still_works",
            "restricted",
            "    import threading\n    out = []\n    t = threading.Thread(target=out.append, args=(5,))\n    t.start()\n"
            "    t.join()\n    return out",
            "ok",
            lambda r: r.answer == [5],
        ),
        K("fork_denied", f"    r = libc.syscall({nr('fork')})\n" + CLONE_CHILD_EXITS + RETURN_ERRNO),
        K(
            "clone_process_denied",
            f"    r = libc.syscall({nr('clone')}, 17, 0, 0, 0, 0)\n" + CLONE_CHILD_EXITS + RETURN_ERRNO,
        ),
        K("socket_unix", errno_of("libc.socket(1, 1, 0)")),
        K("socketpair_unix", errno_of("libc.socketpair(1, 1, 0, ctypes.create_string_buffer(8))")),
        K("ptrace_the_runner", errno_of(f"libc.syscall({nr('ptrace')}, 16, {runner_pid}, 0, 0)")),
        K("process_vm_readv_runner", errno_of(f"libc.syscall({nr('process_vm_readv')}, {runner_pid}, 0, 0, 0, 0, 0)")),
        K("tgkill_the_supervisor", errno_of(f"libc.syscall({nr('tgkill')}, os.getppid(), os.getppid(), 9)")),
        K("pidfd_open_the_runner", errno_of(f"libc.syscall({nr('pidfd_open')}, {runner_pid}, 0)")),
        K("clear_pdeathsig", errno_of("libc.prctl(1, 0, 0, 0, 0)")),
        K("sysv_shmget", errno_of(f"libc.syscall({nr('shmget')}, 0, 4096, 0o1666)")),
        K("mq_open", errno_of(f"libc.syscall({nr('mq_open')}, b'vprl', 0o100 | 2, 0o600, 0)")),
        K("inotify_init", errno_of(f"libc.syscall({nr('inotify_init1')}, 0)")),
        K("execve", errno_of(f"libc.syscall({nr('execve')}, b'/bin/sh', 0, 0)")),
        K(
            "no_capabilities",
            "    data = ctypes.create_string_buffer(24)\n"
            "    libc.capget(ctypes.c_char_p(bytes.fromhex('22050820') + bytes(4)), data)\n"
            "    return 0 if data.raw == bytes(24) else ['capabilities', data.raw.hex()]",
            0,
        ),
        K("newer_syscall_than_reviewed", errno_of("libc.syscall(463, -100, b'x', 0, 0, 0, 0)"), errno.ENOSYS),
        # #37 item 7: a module that is not loaded is missing, as under chroot; the error does not
        # name the file Landlock kept it from (the interpreter's install path on the host).
        P(
            "item_7_import_error_names_no_host_path",
            "restricted",
            "    import subprocess\n    return 1",
            "runtime_error",
            lambda r: (
                r.error.startswith("ModuleNotFoundError: No module named 'subprocess' (line 2")
                and sys.prefix not in r.error
                and sys.base_prefix not in r.error
            ),
        ),
        # What kill() may not do, through a descriptor's I/O signal: the runner, its group, the
        # supervisor's group (#37: this killed the trainer's whole group as root without CAP_SETUID).
        sigio_trick("sigio_kill_the_runner", str(runner_pid), "restricted"),
        sigio_trick("sigio_kill_the_runner_group", f"-os.getpgid({runner_pid})", "restricted"),
        *signal_owner_probes(f"-os.getpgid({runner_pid})", "runner_group"),
    ]


def live_descendants() -> list[int]:
    """Live processes below this one (zombies are reaped: this process is a subreaper)."""
    table = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(pid)] = (int(stat[1]), stat[0])
    found = []
    for pid, (ppid, state) in table.items():
        seen = set()
        while ppid in table and ppid not in seen and ppid != os.getpid():
            seen.add(ppid)
            ppid = table[ppid][0]
        if ppid == os.getpid():
            if state == "Z":
                os.waitpid(pid, os.WNOHANG)
            else:
                found.append(pid)
    return found


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main(condition: str, sandbox: str, out: str, only: str = "") -> int:
    become(condition)
    handler = Lines()
    logging.getLogger("vprl.executor").addHandler(handler)
    os.environ["VPRL_FAKE_HF_TOKEN"] = SECRET_ENV  # must never reach a sandbox
    world = Path(tempfile.mkdtemp(prefix="vprl-restricted-"))
    host, examples = make_world(world)
    labels = world / LABELS
    labels.write_text(json.dumps({examples[0].id: SECRET_ANSWER}))
    report = {"condition": condition, "uid": os.getuid(), "labels": str(labels), "mode": oct(labels.stat().st_mode)}
    config = RunnerConfig(slots=2, timeout_s=TIMEOUT, max_rpcs=MAX_RPCS, sandbox=sandbox)
    try:
        with SyncRunner(host, config) as runner:
            host.preload()
            report["isolation"] = runner.runner.isolation
            report["layers"] = runner.runner.layers
            canary = runner.run([(examples[0], CANARY.format(runner_pid=os.getpid()))])[0]
            report["canary"] = canary.to_json()
            if canary.answer != ["denied"] * 3:
                raise SystemExit(f"the canary could signal other processes, so no probe ran: {canary}")
            probes = PROBES + extra_probes(os.getpid(), str(labels))
            if only:
                probes = [p for p in probes if p.name in only.split(",")]
            results = runner.run([(examples[0], source_of(p)) for p in probes])
            report["results"] = {p.name: r.to_json() for p, r in zip(probes, results)}
            report["after"] = runner.run([(examples[0], NORMAL)])[0].to_json()
            report["supervisor_alive"] = runner.runner.supervisor.alive()
    except SandboxUnavailable as exc:
        report["refused"] = str(exc)
    report["logged"] = handler.lines
    deadline = time.monotonic() + 5
    while (left := live_descendants()) and time.monotonic() < deadline:
        time.sleep(0.05)
    report["left_behind"] = left
    report["labels_mode_after"] = oct(labels.stat().st_mode)
    report["labels_after"] = labels.read_text()
    Path(out).write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
