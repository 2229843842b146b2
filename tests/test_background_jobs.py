"""The background jobs' own mechanics (tests/background_jobs.py): a job's exit, folder and log reach
the test, its process tree is out of the leak checks, and a job nobody started is named."""

import sys

import background_jobs
import own_processes
import pytest

FAILING = background_jobs.register(
    "test_background_jobs_failing",
    lambda out: [sys.executable, "-c", f"import os; open({str(out / 'made')!r}, 'w'); print(os.getpid()); exit(3)"],
)
NEVER = background_jobs.register("test_background_jobs_never", lambda out: [sys.executable, "-c", "pass"])


def test_a_jobs_exit_folder_and_log_reach_the_test():
    background_jobs.start([FAILING])
    done = background_jobs.result(FAILING, timeout_s=120)
    assert done.returncode == 3 and (done.out / "made").is_file() and done.seconds >= 0
    pid = int(done.log_tail.split()[0])
    assert pid in own_processes.FOREIGN  # its sandboxes would not count as the running test's


def test_a_job_that_was_never_started_is_named():
    with pytest.raises(AssertionError, match="test_background_jobs_never.*never started"):
        background_jobs.result(NEVER, timeout_s=1)
