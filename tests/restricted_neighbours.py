"""Two executors side by side on one node, hostile programs in one; tests/test_hostile_restricted.py
runs it and checks what it wrote.

    python tests/restricted_neighbours.py CONDITION OUT.json

In a node of kind CONDITION (tests/node_kinds.py) this process runs a neighbour executor (a second
process, as a second rank would be) with a batch of ordinary programs twice: once alone, for the
clean results, and once while this process's own executor runs programs that aim every way of
signalling at the neighbour: its runner, its supervisor and their process groups, and each of its
sandboxes, found in /proc while its batch runs. The neighbour's two runs must end exactly alike.

    python tests/restricted_neighbours.py --neighbour OUT.json

is the neighbour: it says "started" on stdout once its executor is up, runs the batch and writes
its results, and whether its supervisor lived through it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node_kinds import become  # noqa: E402
from signal_probes import F_GETFL, F_OWNER_PGRP, F_OWNER_PID, F_SETFL, F_SETOWN, F_SETOWN_EX, F_SETSIG, O_ASYNC  # noqa: E402
from test_sandbox import make_world  # noqa: E402

from vprl.executor.runner import RunnerConfig, SyncRunner  # noqa: E402

BATCH = 24
# Each program waits a little, so that the batch is still running when the hostile programs look for it.
ORDINARY = (
    "def execute_command(image):\n    import time\n    time.sleep(0.3)\n"
    "    return [ImagePatch(image).find('cat')[0].simple_query('what color is the cat?'), {}]\n"
)
# Every way of signalling each target (a pid; minus it, its process group), each kept only where it
# went through: the answer must be [] and the neighbour untouched.
HOSTILE = f"""
def execute_command(image):
    import ctypes, os, struct
    libc = ctypes.CDLL(None, use_errno=True)
    through = []
    for target in {{targets}}:
        for owner in (target, -target):
            kind = {F_OWNER_PGRP} if owner < 0 else {F_OWNER_PID}
            ex = ctypes.create_string_buffer(struct.pack('=ii', kind, abs(owner)))
            for way, name in ((lambda r: libc.fcntl(r, {F_SETOWN}, owner), 'F_SETOWN'),
                              (lambda r: libc.fcntl(r, {F_SETOWN_EX}, ex), 'F_SETOWN_EX')):
                r, w = os.pipe()
                steps = [way(r), libc.fcntl(r, {F_SETSIG}, 9), libc.fcntl(r, {F_SETFL}, libc.fcntl(r, {F_GETFL}) | {O_ASYNC})]
                os.write(w, b'x')
                os.close(r)
                os.close(w)
                through += [[owner, name, step] for step, rc in enumerate(steps) if rc != -1]
            try:
                os.kill(owner, 9)
                through.append([owner, 'kill'])
            except OSError:
                pass
    return through
"""


def children(pid: int) -> list[int]:
    """The children of every thread of `pid` (the executor starts its supervisor from its loop thread)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:  # the thread or the process is gone
            continue
    return found


def run_neighbour(out: str) -> int:
    host, examples = make_world(Path(tempfile.mkdtemp(prefix="vprl-neighbour-")))
    with SyncRunner(host, RunnerConfig(slots=2, timeout_s=10.0, sandbox="auto")) as runner:
        host.preload()
        print("started", flush=True)
        results = runner.run([(examples[0], ORDINARY.format(i)) for i in range(BATCH)])
        alive = runner.runner.supervisor.alive()
    rows = [[r.status, r.answer, r.error] for r in results]
    Path(out).write_text(json.dumps({"results": rows, "supervisor_alive": alive}))
    return 0


def neighbour_run(out: Path, attack=None) -> dict:
    """One run of the neighbour; `attack(pid)` is called while it runs, with the neighbour's pid."""
    proc = subprocess.Popen([sys.executable, __file__, "--neighbour", str(out)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    attacks = attack(proc) if attack is not None and line == "started\n" else []
    proc.wait(timeout=300)
    report = json.loads(out.read_text()) if out.exists() else {}
    return {"exit": proc.returncode, "started": line.strip(), "attacks": attacks, **report}


def main(condition: str, out: str) -> int:
    become(condition)
    folder = Path(tempfile.mkdtemp(prefix="vprl-neighbours-"))
    clean = neighbour_run(folder / "clean.json")
    (folder / "world").mkdir()
    host, examples = make_world(folder / "world")

    with SyncRunner(host, RunnerConfig(slots=2, timeout_s=5.0, sandbox="auto")) as hostile:

        def attack(neighbour: subprocess.Popen) -> list:
            answers = []
            while neighbour.poll() is None:
                supervisors = children(neighbour.pid)
                sandboxes = [pid for sup in supervisors for pid in children(sup)]
                targets = [neighbour.pid, *supervisors, *sandboxes]
                source = HOSTILE.format(targets=targets) + f"# {time.monotonic()}\n"
                (result,) = hostile.run([(examples[0], source)])
                answers.append([len(sandboxes), result.status, result.answer, result.error])
                time.sleep(0.05)  # leave the neighbour some of the machine's two cores
            return answers

        beside = neighbour_run(folder / "beside.json", attack)
        hostile_alive = hostile.runner.supervisor.alive()
    Path(out).write_text(json.dumps({"clean": clean, "beside": beside, "hostile_alive": hostile_alive}))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--neighbour":
        sys.exit(run_neighbour(sys.argv[2]))
    sys.exit(main(*sys.argv[1:]))
