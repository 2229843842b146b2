"""Sandbox uids that no other executor on the machine uses at the same time.

Every program runs as a uid of its slot's own, and each slot takes its uids in turn from a range of
`UIDS_PER_SLOT`: RLIMIT_NPROC counts a uid's processes system-wide, so a program must not share its
uid with the processes of the slot's previous program, which may still be dying (a fork bomb's
children) when the next one starts. Those uids used to be the same fixed numbers in every
executor, so two executors on one machine (two ranks of a run) ran programs under the same uids: a
program of one could then signal the other's programs (the kernel lets a uid signal its own
processes), and its processes counted against the other's RLIMIT_NPROC.

So each supervisor claims its slots' ranges from the machine's pool, one lock file per range in a
run-time folder of root's, held with `flock` for as long as the supervisor lives. The kernel drops
a lock when the last descriptor of it closes, which happens however the supervisor dies: nothing
stale can keep a range, and nothing needs cleaning up. Sandboxes close the inherited descriptor
right after fork (child._fixed_descriptors), so only the supervisor holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile

SANDBOX_UID_BASE = 60000
UIDS_PER_SLOT = 8
# 60000 + [0, 992): 124 ranges of 8; 60999 is the layer probe's (probe.probe_layers).
POOL_RANGES = 124
POOL_END = SANDBOX_UID_BASE + POOL_RANGES * UIDS_PER_SLOT
LOCK_FOLDER = "vprl-sandbox-uids"
# /run is the machine's run-time folder (a tmpfs, root's); the temporary folder is the fallback
# where a container has no /run. Every executor on the machine must pick the same one.
RUN_DIRS = ("/run", tempfile.gettempdir())


def check_slots(slots: int) -> None:
    if not 0 < slots <= POOL_RANGES:
        raise ValueError(f"slots must be 1..{POOL_RANGES} (each slot takes {UIDS_PER_SLOT} sandbox uids), got {slots}")


def uid_of(base: int, turn: int) -> int:
    """The uid of the `turn`-th sandbox of the slot whose range starts at `base`."""
    return base + turn % UIDS_PER_SLOT


def unclaimed(slots: int) -> list[int]:
    """Each slot's range where no uid is ever switched to (no root): the numbers are only labels."""
    return [SANDBOX_UID_BASE + slot * UIDS_PER_SLOT for slot in range(slots)]


class Claim:
    """One range of `UIDS_PER_SLOT` uids per slot, held until `release` or the process's death."""

    def __init__(self, slots: int, run_dirs: tuple[str, ...] = RUN_DIRS) -> None:
        check_slots(slots)
        self.folder = lock_folder(run_dirs)
        self.bases: list[int] = []
        self._fds: list[int] = []
        try:
            for index in range(POOL_RANGES):
                if len(self.bases) == slots:
                    break
                base = SANDBOX_UID_BASE + index * UIDS_PER_SLOT
                fd = os.open(
                    os.path.join(self.folder, f"{base}.lock"),
                    os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o600,
                )
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # another executor's
                    os.close(fd)
                    continue
                self.bases.append(base)
                self._fds.append(fd)
            if len(self.bases) < slots:
                raise OSError(
                    f"sandbox uids: this executor needs {slots} uid ranges (one per slot) but only "
                    f"{len(self.bases)} of the machine's {POOL_RANGES} are free (the others are held by "
                    f"executors running here, see the lock files in {self.folder}); use fewer slots per executor"
                )
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


def lock_folder(run_dirs: tuple[str, ...] = RUN_DIRS) -> str:
    """The lock files' folder, made if needed: under the first writable run-time folder, owned by
    this user and writable by nobody else (anyone else could hold every range, or plant links)."""
    parent = next((d for d in run_dirs if os.path.isdir(d) and os.access(d, os.W_OK)), None)
    if parent is None:
        raise OSError(f"sandbox uids: none of {', '.join(run_dirs)} is a writable folder for the uid lock files")
    folder = os.path.join(parent, LOCK_FOLDER)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise OSError(
            f"sandbox uids: {folder} must be a folder owned by uid {os.geteuid()} and writable by nobody else "
            "(remove it and start again)"
        )
    return folder
