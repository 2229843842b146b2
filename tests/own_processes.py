"""Which sandbox processes are this test run's own.

Leak checks count processes running under the sandbox uids. Counting them system-wide made a test
fail beside another job on the same machine (its sandboxes use the same uids), so a check counts
only this pytest process's descendants. For a sandbox that outlives its supervisor to stay a
descendant rather than be handed to init, pytest is made a child subreaper (`adopt_orphans`, set for
the whole run by conftest.py): orphans of our process tree are reparented to it.
"""

from __future__ import annotations

import ctypes
import os

from vprl.executor.sandbox.uids import SANDBOX_UID_BASE

PR_SET_CHILD_SUBREAPER = 36
# Roots of process trees this run started that no test owns: the background jobs
# (tests/background_jobs.py) run beside the tests, and their sandboxes are theirs.
FOREIGN: set[int] = set()


def adopt_orphans(on: bool = True) -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _status(pid: str) -> tuple[int, int, str] | None:
    """(ppid, real uid, state letter), or None when the process is gone."""
    fields: dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
    except OSError:
        return None
    try:
        return int(fields["PPid"]), int(fields["Uid"].split()[0]), fields["State"][:1]
    except (KeyError, ValueError, IndexError):
        return None


def sandbox_pids(ours_only: bool = True) -> list[int]:
    """Live processes under a sandbox uid; with `ours_only`, those descended from this process.
    Zombies are dead: they are left out, and the ones adopted by this process are reaped."""
    table = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _status(p)) is not None}
    me, found = os.getpid(), []
    for pid, (ppid, uid, state) in table.items():
        if not SANDBOX_UID_BASE <= uid < SANDBOX_UID_BASE + 1000:
            continue
        if state == "Z":
            if ppid == me:
                _reap(pid)
            continue
        if ours_only and not _descends_from(pid, me, table):
            continue
        found.append(pid)
    return sorted(found)


def _descends_from(pid: int, ancestor: int, table: dict[int, tuple[int, int, str]]) -> bool:
    seen = set()
    while pid in table and pid not in seen:
        seen.add(pid)
        if pid in FOREIGN:
            return False
        pid = table[pid][0]
        if pid == ancestor:
            return True
    return False


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return  # reaped meanwhile by whoever started it
