"""The few Linux calls Python 3.11's `os` lacks (unshare, prctl), through libc."""

from __future__ import annotations

import ctypes
import os

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

_libc = ctypes.CDLL(None, use_errno=True)
_unshare = _libc.unshare
_unshare.argtypes = [ctypes.c_int]
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def unshare(flags: int) -> None:
    _check(_unshare(flags), f"unshare({flags:#x})")


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
