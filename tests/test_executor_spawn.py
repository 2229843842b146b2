"""The two ways of starting a sandbox ("clone" with spares and pooled network namespaces, and the
original "fork") give the same isolation; the pooled network namespaces never let two programs meet."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from own_processes import SANDBOX_UID_BASE, sandbox_pids
from test_sandbox import CANARY, make_world

from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.executor.sandbox import syscalls
from vprl.executor.sandbox.uids import POOL_END

ROOT = Path(__file__).resolve().parents[1]

SPAWNS = ["clone", "fork"]

# An abstract unix socket is the one thing two processes in one network namespace can meet on
# without a file. `ctypes` is importable in a sandbox (the supervisor has it loaded), so a program
# can make one. A listener holds one open for a while; a caller tries to reach it.
SOCKETS = """
def execute_command(image):
    import ctypes, struct, time
    libc = ctypes.CDLL(None, use_errno=True)
    address = struct.pack("H", 1) + b"\\0vprl-rendezvous"
    def sock():
        return libc.socket(1, 1, 0)  # AF_UNIX, SOCK_STREAM
    role = "{role}"
    if role in ("listen", "both"):
        listener = sock()
        if libc.bind(listener, address, len(address)) or libc.listen(listener, 4):
            return "bind failed %d" % ctypes.get_errno()
        if role == "listen":
            time.sleep({hold})
            return "bound"
    time.sleep({wait})
    if libc.connect(sock(), address, len(address)):
        return "refused %d" % ctypes.get_errno()
    return "connected"
"""


def sockets(role: str, hold: float = 0.0, wait: float = 0.0) -> str:
    return SOCKETS.format(role=role, hold=hold, wait=wait)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("spawn"))


@pytest.mark.parametrize("spawn", SPAWNS)
def test_both_spawns_pass_the_canary(world, spawn):
    host, examples = world
    with SyncRunner(host, RunnerConfig(slots=2, timeout_s=2.0, spawn=spawn)) as runner:
        assert runner.runner.supervisor.spawn == spawn
        results = runner.run([(examples[i % 2], CANARY + f"# {i}\n") for i in range(6)])
    for result in results:
        assert result.status == "ok", result
        facts = result.answer
        assert SANDBOX_UID_BASE <= facts["uid"] < POOL_END
        # "clone": the program is its namespace's init; "fork": PID 2, under an init of ours
        assert facts["pid"] == (1 if spawn == "clone" else 2)
        assert facts["root"] == [] and facts["env"] == [] and facts["fds"] == [0, 1, 2, 3, 4]
        assert facts["setuid0"] is False and facts["socket"] == "absent"
    assert not sandbox_pids() or _gone()


@pytest.mark.parametrize("spawn", SPAWNS)
def test_programs_never_meet_on_a_socket(world, spawn):
    host, examples = world
    ex = examples[0]
    with SyncRunner(host, RunnerConfig(slots=2, timeout_s=5.0, spawn=spawn)) as runner:
        # The probe works: inside one program, a socket it listens on is reachable.
        (alone,) = runner.run([(ex, sockets("both"))])
        # Two programs at the same time, in the two slots.
        listener, caller = runner.run([(ex, sockets("listen", hold=1.0)), (ex, sockets("call", wait=0.3))])
    assert alone.answer == "connected", alone
    assert listener.answer == "bound" and caller.answer.startswith("refused"), (listener, caller)
    # One slot: the next program of the slot starts after the previous one (and its socket) is gone.
    with SyncRunner(host, RunnerConfig(slots=1, timeout_s=5.0, spawn=spawn)) as runner:
        first, second = runner.run([(ex, sockets("listen") + "# 1\n"), (ex, sockets("call") + "# 2\n")])
    assert first.answer == "bound" and second.answer.startswith("refused"), (first, second)


CLONE_CHECK = """
import os, sys
from vprl.executor.sandbox import syscalls
pid = syscalls.fork_into_namespaces(syscalls.CLONE_NEWPID | syscalls.CLONE_NEWUTS)
if pid == 0:
    os._exit(0 if os.getpid() == 1 and os.getppid() == 0 else 1)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_fork_into_namespaces_makes_the_child_pid_one():
    if os.geteuid() != 0:
        pytest.skip("new pid namespaces need root")
    # In a fresh single-threaded interpreter, as the supervisor is: pytest has threads.
    done = subprocess.run([sys.executable, "-c", CLONE_CHECK], cwd=ROOT, timeout=60)
    assert done.returncode == 0


def test_fork_into_namespaces_refuses_a_threaded_process():
    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        with pytest.raises(RuntimeError, match="single-threaded"):
            syscalls.fork_into_namespaces(syscalls.CLONE_NEWUTS)
    finally:
        release.set()
        worker.join()


def _gone(seconds: float = 2.0) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while sandbox_pids() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not sandbox_pids()


@pytest.mark.parametrize("spawn", SPAWNS)
def test_a_fork_bomb_does_not_use_up_the_next_program_s_processes(world, spawn):
    """RLIMIT_NPROC counts a uid's processes; a fork bomb's children may still be dying when the
    slot's next program starts, so that program runs under another uid of the slot's range."""
    host, examples = world
    bomb = (
        "def execute_command(image):\n    import os\n    n = 0\n    for _ in range(40):\n        try:\n"
        "            if os.fork() == 0:\n                while True:\n                    pass\n            n += 1\n"
        "        except OSError:\n            break\n    return n\n"
    )
    # As many sleeping children as the limit allows: all of them, unless the bomb's are still counted.
    forks = (
        "def execute_command(image):\n    import os, time\n    n = 0\n    for _ in range(15):\n        try:\n"
        "            if os.fork() == 0:\n                time.sleep(5)\n                os._exit(0)\n            n += 1\n"
        "        except OSError:\n            break\n    return [n, os.getuid()]\n"
    )
    with SyncRunner(host, RunnerConfig(slots=1, timeout_s=2.0, spawn=spawn)) as runner:
        for i in range(3):
            first, second = runner.run([(examples[0], bomb + f"# {i}\n"), (examples[0], forks + f"# {i}\n")])
            assert first.status == "ok" and first.answer < 16, first
            assert second.status == "ok" and second.answer[0] == 15, second
            assert SANDBOX_UID_BASE <= second.answer[1] < POOL_END
    assert _gone()
