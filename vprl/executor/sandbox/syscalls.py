"""The few Linux calls Python 3.11's `os` lacks (unshare, setns, prctl, clone with flags, capset), through libc."""

from __future__ import annotations

import ctypes
import os
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACES = {
    "netns": CLONE_NEWNET,
    "mountns": CLONE_NEWNS,
    "ipcns": CLONE_NEWIPC,
    "utsns": CLONE_NEWUTS,
    "pidns": CLONE_NEWPID,
}

PR_SET_PDEATHSIG = 1
PR_GET_PDEATHSIG = 2
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39

SIGCHLD = 17

_libc = ctypes.CDLL(None, use_errno=True)
_unshare = _libc.unshare
_unshare.argtypes = [ctypes.c_int]
_setns = _libc.setns
_setns.argtypes = [ctypes.c_int, ctypes.c_int]
# `syscall` through PyDLL keeps the GIL held across the call, exactly like `os.fork` does around
# fork(): the child must not start life with the interpreter lock in a half-released state.
_syscall = ctypes.PyDLL(None, use_errno=True).syscall
_syscall.restype = ctypes.c_long
_before_fork = ctypes.pythonapi.PyOS_BeforeFork
_after_fork_child = ctypes.pythonapi.PyOS_AfterFork_Child
_after_fork_parent = ctypes.pythonapi.PyOS_AfterFork_Parent
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def unshare(flags: int) -> None:
    _check(_unshare(flags), f"unshare({flags:#x})")


def setns(fd: int, nstype: int) -> None:
    _check(_setns(fd, nstype), f"setns({fd}, {nstype:#x})")


def _clone_syscall_number() -> int:
    machine = os.uname().machine
    if machine == "x86_64":
        return 56
    if machine in ("aarch64", "riscv64", "loongarch64"):
        return 220
    raise OSError(f"clone with namespace flags is not wired for {machine}; use spawn 'fork'")


def fork_into_namespaces(flags: int) -> int:
    """`os.fork()` that also creates the namespaces in `flags` for the child (clone(2) without a new
    stack, which is what fork is). With CLONE_NEWPID the child is PID 1 of its namespace directly,
    which saves the extra process `unshare` + fork needs.

    Python's own fork bookkeeping runs around it (`PyOS_BeforeFork` / `PyOS_AfterFork_*`: import
    lock, GIL, at-fork hooks), as in `os.fork`. glibc's fork handlers do not run: they guard locks
    that other threads could hold, and the supervisor that calls this is single-threaded (checked:
    a process with other threads gets a RuntimeError). The one
    piece of glibc state left stale in the child is the cached thread id, which only matters to
    pthread_kill on another thread of the same process; the child (a namespace's init) only
    chroots, forks with glibc's fork (which refreshes the cache) and waits.
    """
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        # Another thread may hold a lock (malloc's, say) that glibc's fork would have reset and this
        # clone does not: the child would hang on it.
        raise RuntimeError(f"fork_into_namespaces needs a single-threaded process; this one has {threads} threads")
    number = _clone_syscall_number()
    _before_fork()
    pid = _syscall(ctypes.c_long(number), ctypes.c_ulong(flags | SIGCHLD), ctypes.c_ulong(0), ctypes.c_ulong(0),
                   ctypes.c_ulong(0), ctypes.c_ulong(0))  # fmt: skip
    if pid == 0:
        _after_fork_child()
        return 0
    err = ctypes.get_errno()
    _after_fork_parent()
    if pid < 0:
        raise OSError(err, f"clone({flags:#x}): {os.strerror(err)}")
    return pid


def prctl(option: int, arg: int = 0) -> int:
    return _check(_prctl(option, arg, 0, 0, 0), f"prctl({option})")


def set_pdeathsig(sig: int) -> None:
    prctl(PR_SET_PDEATHSIG, sig)


def get_pdeathsig() -> int:
    value = ctypes.c_int(0)
    _check(_prctl(PR_GET_PDEATHSIG, ctypes.addressof(value), 0, 0, 0), "prctl(PR_GET_PDEATHSIG)")
    return value.value


def set_no_new_privs() -> None:
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def set_child_subreaper() -> None:
    prctl(PR_SET_CHILD_SUBREAPER, 1)


_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def drop_capabilities() -> None:
    """Empty this thread's effective, permitted and inheritable capability sets (for good: without
    exec nothing gives them back). A uid 0 that cannot change uid may still hold some."""
    header = struct.pack("=Ii", _LINUX_CAPABILITY_VERSION_3, 0)
    _check(_libc.capset(header, bytes(24)), "capset")
