"""Landlock (Linux >= 5.13), through ctypes: the restricted sandbox's file-system wall when there is
no chroot (docs/design-notes.md#the-sandbox-without-namespaces).

A program restricts itself with a ruleset that handles every access right its kernel knows and
grants none: from then on it can open, list, execute, create, remove, rename, link or truncate
nothing, anywhere (descriptors opened before stay usable). Unlike chroot it needs no privilege,
only NO_NEW_PRIVS. It does not hide names: stat, access and readlink still work on any path.
From ABI 4 the ruleset also handles TCP bind/connect, and from ABI 6 it scopes abstract unix
sockets and signals to the program itself; the restricted seccomp filter denies those already,
so these are a second wall, used where the kernel has them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

# The syscall numbers are the same on every architecture (the shared table above 424).
SYS_CREATE_RULESET = 444
SYS_RESTRICT_SELF = 446
CREATE_RULESET_VERSION = 1 << 0

# Access rights by the ABI version that introduced them (include/uapi/linux/landlock.h).
FS_ABI_1 = (1 << 13) - 1  # execute, write, read, read_dir, remove_dir/file, make_char/dir/reg/sock/fifo/block/sym
FS_REFER = 1 << 13  # ABI 2: link or rename across directories
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_TCP = (1 << 0) | (1 << 1)  # ABI 4: bind, connect
SCOPE_ALL = (1 << 0) | (1 << 1)  # ABI 6: abstract unix sockets, signals

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is absent or disabled (the reason is
    raised by `require`)."""
    try:
        return require()
    except OSError:
        return 0


def require() -> int:
    """The ABI version, or an OSError saying why Landlock cannot be used here."""
    version = _syscall(
        ctypes.c_long(SYS_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION)
    )
    if version < 0:
        err = ctypes.get_errno()
        why = {
            errno.ENOSYS: "the kernel has no Landlock (it needs Linux >= 5.13 built with CONFIG_SECURITY_LANDLOCK) "
            "or a seccomp policy hides it",
            errno.EOPNOTSUPP: "Landlock is built in but disabled: add `landlock` to the `lsm=` boot parameter "
            "(see /sys/kernel/security/lsm)",
        }.get(err, os.strerror(err))
        raise OSError(err, f"landlock_create_ruleset: {why}")
    return int(version)


def ruleset_attr(abi: int) -> bytes:
    """`struct landlock_ruleset_attr` that handles everything ABI `abi` knows: fs, net, scoped."""
    fs = FS_ABI_1
    if abi >= 2:
        fs |= FS_REFER
    if abi >= 3:
        fs |= FS_TRUNCATE
    if abi >= 5:
        fs |= FS_IOCTL_DEV
    net = NET_TCP if abi >= 4 else 0
    scoped = SCOPE_ALL if abi >= 6 else 0
    # A kernel older than the struct's last field accepts it as long as the fields it lacks are 0.
    return struct.pack("=QQQ", fs, net, scoped)


def deny_everything(abi: int) -> None:
    """Restrict this thread (and what it forks) to no file-system access at all. Needs NO_NEW_PRIVS
    and a single-threaded process (a ruleset applies to the calling thread only)."""
    if abi < 1:
        raise OSError(errno.ENOSYS, "no Landlock ABI to restrict with")
    attr = ctypes.create_string_buffer(ruleset_attr(abi))
    fd = _syscall(ctypes.c_long(SYS_CREATE_RULESET), attr, ctypes.c_size_t(len(attr.raw)), ctypes.c_uint32(0))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock_create_ruleset: {os.strerror(err)}")
    try:
        if _syscall(ctypes.c_long(SYS_RESTRICT_SELF), ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(fd)
