"""Long, self-contained jobs of the suite run on the machine's second core while the other tests run.

Almost every test keeps one core busy (one process working while the others wait on it), so on two
cores the suite leaves one idle. A job registered here (a command line, at a test module's import)
starts when collection ends, if a selected test needs it; the jobs run one after another in a thread
of pytest, and the tests that read a job's result are moved to the end of the session, by when it has
finished. What a job runs is what the test ran before: the assertions are the test's, unchanged.

    JOB = background_jobs.register("full_bootstrap", lambda out: [sys.executable, "-m", ...])

    @pytest.mark.background("full_bootstrap")
    def test_x():
        done = background_jobs.result("full_bootstrap")  # waits; done.out is the job's folder

A job's processes are left out of the sandbox leak checks (`own_processes.FOREIGN`): its sandboxes
belong to it, not to the test that happens to be running beside it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import own_processes

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Finished:
    returncode: int
    out: Path  # the job's own folder, its command's argument
    seconds: float
    log_tail: str


@dataclass
class Job:
    name: str
    command: Callable[[Path], list[str]]
    env: dict[str, str] | None  # None: this process's
    queued: bool = False
    out: Path | None = None
    process: subprocess.Popen | None = None
    finished: Finished | None = None
    done: threading.Event = field(default_factory=threading.Event)


JOBS: dict[str, Job] = {}
_ROOTS: list[Path] = []  # one folder per start()


def register(name: str, command: Callable[[Path], list[str]], env: dict[str, str] | None = None) -> str:
    """A job: `command(out)` run in the repository, in `env` (default: this process's); returns `name`."""
    if name in JOBS:
        raise ValueError(f"background job {name!r} is registered twice")
    JOBS[name] = Job(name, command, env)
    return name


def start(names: list[str]) -> None:
    """Run the named jobs, one after another, in a thread of this process."""
    jobs = [JOBS[name] for name in names]
    if not jobs:
        return
    _ROOTS.append(Path(tempfile.mkdtemp(prefix="vprl-background-")))
    for job in jobs:
        job.queued = True
    threading.Thread(target=_run_all, args=(jobs, _ROOTS[-1]), name="background-jobs", daemon=True).start()


def _run_all(jobs: list[Job], root: Path) -> None:
    for job in jobs:
        job.out = root / job.name
        job.out.mkdir()
        log = job.out / "job.log"
        began = time.monotonic()
        try:
            with open(log, "w") as fh:
                job.process = subprocess.Popen(
                    job.command(job.out),
                    cwd=REPO,
                    env=os.environ.copy() if job.env is None else job.env,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # ended as a group at the session's end
                )
                own_processes.FOREIGN.add(job.process.pid)
                returncode = job.process.wait()
        except OSError as exc:  # the command could not start: the test reports it
            log.write_text(f"could not start {job.name}: {exc}")
            returncode = -1
        tail = log.read_text(errors="replace")[-6000:]
        job.finished = Finished(returncode, job.out, round(time.monotonic() - began, 1), tail)
        job.done.set()


def result(name: str, timeout_s: float = 2400) -> Finished:
    """The job's outcome, once it has finished (it was started at collection)."""
    job = JOBS[name]
    if not job.queued:
        raise AssertionError(f"background job {name!r} was never started: mark its test @pytest.mark.background")
    if not job.done.wait(timeout_s):
        raise AssertionError(f"background job {name!r} still running after {timeout_s:.0f} s")
    return job.finished


def stop_all() -> None:
    """End what still runs (an interrupted session) and remove the jobs' folders."""
    for job in JOBS.values():
        if job.process is not None and job.process.poll() is None:
            os.killpg(job.process.pid, signal.SIGKILL)
            job.process.wait()
    while _ROOTS:
        shutil.rmtree(_ROOTS.pop())
