"""The kinds of node the restricted sandbox is for, made from this machine (root, with namespaces)
for the calling process and everything it starts, before an executor starts (`become`):

- `container_root`: root under a seccomp filter that denies namespaces, as a container runtime's
  default profile does (chroot and setuid still work);
- `unprivileged`: every capability dropped for good, so no namespace, chroot or uid change works,
  as for a Slurm user. The uid stays 0 only because the interpreter lives under /root (0700);
  without capabilities uid 0 is an ordinary user that owns, and may write, the files owned by root;
- `unprivileged_no_landlock`: the same, on a kernel without Landlock (it answers ENOSYS);
- `unprivileged_landlock_5`: the same, on a kernel whose Landlock is at most ABI 5 (Linux 5.13 to
  6.11, e.g. Ubuntu 22.04's 5.15): it has no signal scoping, so only the seccomp filter stands
  between a program and the other processes of its uid. The kernel's answer to the version query
  is replaced through a seccomp user notification (`cap_landlock_abi`);
- `root_without_setuid`: a container's root whose runtime also dropped CAP_SETUID and CAP_SETGID:
  chroot works, a uid change does not, and the programs must not keep root's other capabilities.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import threading
from pathlib import Path

from vprl.executor.sandbox import seccomp
from vprl.executor.sandbox.restricted_filter import AUDIT_ARCH

CONDITIONS = (
    "container_root",
    "unprivileged",
    "unprivileged_no_landlock",
    "unprivileged_landlock_5",
    "root_without_setuid",
)
UNPRIVILEGED = ("unprivileged", "unprivileged_no_landlock", "unprivileged_landlock_5")


def become(condition: str) -> None:
    """Make this process (and what it starts) a node of kind `condition`, and a child subreaper."""
    if condition not in CONDITIONS:
        raise SystemExit(f"error: CONDITION must be one of {CONDITIONS}, got {condition!r}")
    if condition in ("container_root", "root_without_setuid"):
        if condition == "root_without_setuid":
            drop_from_bounding_set(6, 7)  # CAP_SETGID, CAP_SETUID
        deny(NO_NAMESPACES)
    else:
        drop_capabilities()
        if condition == "unprivileged_no_landlock":
            deny(NO_LANDLOCK)
        if condition == "unprivileged_landlock_5":
            cap_landlock_abi(5)
    _prctl(36, 1)  # a child subreaper: whatever a sandbox leaves behind stays ours to find


def _prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {arg})")


def drop_capabilities() -> None:
    """No capability, now or after any exec: bounding set emptied, uid 0 no longer grants any."""
    pr_capbset_drop, pr_set_securebits, pr_cap_ambient, ambient_clear_all = 24, 28, 47, 4
    for cap in range(int(Path("/proc/sys/kernel/cap_last_cap").read_text()) + 1):
        _prctl(pr_capbset_drop, cap)
    _prctl(pr_cap_ambient, ambient_clear_all)
    _prctl(pr_set_securebits, 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x20)  # noroot, no_setuid_fixup, keep_caps: locked
    header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.capset(header, bytes(24)) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def drop_from_bounding_set(*caps: int) -> None:
    """Capabilities that no program started from here (as root) will have."""
    for cap in caps:
        _prctl(24, cap)  # PR_CAPBSET_DROP


def deny(rules: tuple) -> None:
    """Load a filter of `rules` on this process and everything it starts."""
    _prctl(38, 1)  # NO_NEW_PRIVS, which an unprivileged process needs to load a filter
    seccomp.Program(seccomp.build_bpf(rules)).load()


NO_NAMESPACES = (
    seccomp.Rule("unshare"),
    seccomp.Rule("setns"),
    *(seccomp.Rule("clone", when=(0, seccomp.SCMP_CMP_MASKED_EQ, f, f)) for f in seccomp.CLONE_NAMESPACE_FLAGS),
    seccomp.Rule("clone3", errno.ENOSYS),
)
NO_LANDLOCK = (seccomp.Rule("landlock_create_ruleset", errno.ENOSYS),)


# The user-notification ABI (linux/seccomp.h): struct seccomp_notif is 80 bytes, the response 24.
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER = 1, 1 << 3
SECCOMP_RET_USER_NOTIF, SECCOMP_RET_ALLOW = 0x7FC00000, 0x7FFF0000
NOTIF_RECV, NOTIF_SEND = 0xC0502100, 0xC0182101
LANDLOCK_CREATE_RULESET, LANDLOCK_CREATE_RULESET_VERSION = 444, 1


def cap_landlock_abi(abi: int) -> None:
    """From now on this process and everything it starts learn Landlock ABI `abi` when they ask
    for the version; everything else about Landlock is the kernel's own. Rulesets built for `abi`
    then handle only what that ABI knows, exactly as on an older kernel."""
    arch = AUDIT_ARCH[os.uname().machine]
    # nr at 0, arch at 4, args[2]'s low half at 32 (struct seccomp_data); jumps are relative.
    code = [
        (0x20, 0, 0, 4),
        (0x15, 1, 0, arch),
        (0x06, 0, 0, SECCOMP_RET_ALLOW),
        (0x20, 0, 0, 0),
        (0x15, 0, 3, LANDLOCK_CREATE_RULESET),
        (0x20, 0, 0, 32),
        (0x15, 0, 1, LANDLOCK_CREATE_RULESET_VERSION),
        (0x06, 0, 0, SECCOMP_RET_USER_NOTIF),
        (0x06, 0, 0, SECCOMP_RET_ALLOW),
    ]
    bpf = ctypes.create_string_buffer(b"".join(struct.pack("=HBBI", *row) for row in code))
    prog = struct.pack("@HP", len(code), ctypes.addressof(bpf))
    _prctl(38, 1)  # NO_NEW_PRIVS
    libc = ctypes.CDLL(None, use_errno=True)
    listener = libc.syscall(
        seccomp.syscall_number("seccomp"), SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, prog
    )
    if listener < 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_FILTER_FLAG_NEW_LISTENER)")
    threading.Thread(target=_answer_version, args=(listener, abi), name="landlock-abi", daemon=True).start()


def _answer_version(listener: int, abi: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    notif = ctypes.create_string_buffer(80)
    while True:
        ctypes.memset(notif, 0, len(notif))  # the kernel refuses a buffer that is not zeroed
        if libc.ioctl(listener, ctypes.c_ulong(NOTIF_RECV), notif) != 0:
            if ctypes.get_errno() in (errno.EINTR, errno.ENOENT):  # the caller died before we read it
                continue
            raise OSError(ctypes.get_errno(), "SECCOMP_IOCTL_NOTIF_RECV")
        (request,) = struct.unpack_from("=Q", notif.raw)
        reply = ctypes.create_string_buffer(struct.pack("=QqiI", request, abi, 0, 0))
        # ENOENT: the caller died meanwhile, and nobody waits for this answer.
        if libc.ioctl(listener, ctypes.c_ulong(NOTIF_SEND), reply) != 0 and ctypes.get_errno() != errno.ENOENT:
            raise OSError(ctypes.get_errno(), "SECCOMP_IOCTL_NOTIF_SEND")
