"""Probes that try to signal something outside the program through a descriptor's I/O signal
(#37): the full sandbox holds them by its pid namespace and its filter, the restricted one by its
filter alone. Part of tests/hostile_probes.py's PROBES; tests/restricted_suite.py aims them at the
runner too."""

from __future__ import annotations

import errno
from dataclasses import replace

from probe_kit import K, P, Probe, answer_is, errno_of

# fcntl commands and ioctls that name whom a descriptor's I/O signal goes to.
F_SETFL, F_GETFL, F_SETOWN, F_SETSIG, F_SETOWN_EX, F_OWNER_PID, F_OWNER_PGRP = 4, 3, 8, 10, 15, 1, 2
FIOASYNC, FIOSETOWN, SIOCSPGRP, O_ASYNC = 0x5452, 0x8901, 0x8902, 0o20000


def sigio_trick(name: str, target: str, category: str = "signal_outside") -> Probe:
    """A pipe whose owner is `target` (a pid, or minus a process group), SIGKILL as its I/O signal,
    O_ASYNC on, one byte written: had any step gone through, the kernel would have sent the signal
    with the program's credentials. Each step must be refused; the damage check is the caller's
    (the supervisor and the runner still alive, a later program still answers)."""
    body = (
        "    import ctypes, os\n    libc = ctypes.CDLL(None, use_errno=True)\n    r, w = os.pipe()\n"
        f"    steps = [libc.fcntl(r, {F_SETOWN}, {target}), libc.fcntl(r, {F_SETSIG}, 9),\n"
        f"             libc.fcntl(r, {F_SETFL}, libc.fcntl(r, {F_GETFL}) | {O_ASYNC})]\n"
        "    got = [ctypes.get_errno() if step == -1 else 'went through' for step in steps]\n"
        "    os.write(w, b'x')\n    return got"
    )
    return P(name, category, body, "ok", answer_is([errno.EPERM] * 3))


def signal_owner_probes(target: str, suffix: str) -> list[Probe]:
    """Each other way of naming `target` as a descriptor's signal owner, one probe each."""
    pipe = "    r, w = os.pipe()\n"
    owner_ex = f"ctypes.create_string_buffer(struct.pack('=ii', {F_OWNER_PGRP}, {target}))"
    probes = [
        K(
            f"f_setown_ex_{suffix}",
            f"    import struct\n{pipe}" + errno_of(f"libc.fcntl(r, {F_SETOWN_EX}, {owner_ex})"),
        ),
        *(
            K(f"{name}_{suffix}", pipe + errno_of(f"libc.ioctl(r, {request}, ctypes.byref(ctypes.c_int({arg})))"))
            for name, request, arg in (
                ("fioasync", FIOASYNC, 1),
                ("fiosetown", FIOSETOWN, target),
                ("siocspgrp", SIOCSPGRP, target),
            )
        ),
    ]
    return [replace(probe, category="signal_outside") for probe in probes]


SIGNAL_OUTSIDE = [
    # -- signalling something outside, through a descriptor's I/O signal ----------------------
    # The full sandbox's pid namespace hides outside pids (its parent is pid 0, pid 1 is its own
    # init or itself); the restricted one has no namespace. Both must refuse every step.
    sigio_trick("sigio_kill_parent", "os.getppid()"),
    sigio_trick("sigio_kill_parent_group", "-os.getpgid(os.getppid())"),
    # Never written to: had it gone through, the machine's init would not even have been asked.
    replace(K("f_setown_pid_1", errno_of(f"libc.fcntl(os.pipe()[0], {F_SETOWN}, 1)")), category="signal_outside"),
    *signal_owner_probes("os.getppid()", "parent"),
]
