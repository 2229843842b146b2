"""A seccomp denylist for sandboxed programs: built once with libseccomp, loaded per program as raw BPF.

The supervisor builds the filter once at start (`build_bpf`, through ctypes over `libseccomp.so.2`,
so no extra Python package), and `arm`s it; every sandbox program process then loads those bytes
with one `prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ...)` at the end of its set-up (`load_armed`),
after NO_NEW_PRIVS and the uid drop, which costs microseconds instead of the milliseconds that
building the filter takes. The filter is inherited by everything the program forks and can never
be removed.

The restricted mode (no namespaces) loads a stricter list instead, and a per-program filter on top
(restricted_filter.py). Everything is allowed except `DENYLIST`: a denied call fails with EPERM (clone3 with ENOSYS, so
glibc falls back to clone, whose flags the filter can see). A syscall of another ABI than the
native one (i386 `int 0x80`, x32) kills the process: the table only names native numbers.
Importing this module loads nothing; libseccomp is opened on first use (the supervisor and the
layer probe), so a machine without it fails the "seccomp" layer with a clear message instead of
failing to import.
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass

# libseccomp's ABI (seccomp.h of 2.5.x).
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_KILL_PROCESS = 0x80000000
SCMP_FLTATR_ACT_BADARCH = 2
SCMP_FLTATR_CTL_OPTIMIZE = 8  # since 2.5.0
SCMP_OPTIMIZE_BINARY_TREE = 2
SCMP_CMP_NE = 1
SCMP_CMP_MASKED_EQ = 7
NR_SCMP_ERROR = -1
# The kernel's (linux/prctl.h, linux/seccomp.h).
PR_SET_SECCOMP = 22
PR_GET_SECCOMP = 21
SECCOMP_MODE_FILTER = 2

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
# CLONE_NEWTIME (0x80) is left out on purpose: in clone(2)'s flags that bit is part of the exit
# signal; a time namespace can only be made with unshare or clone3, both denied outright.
CLONE_NAMESPACE_FLAGS = (
    CLONE_NEWNS,
    CLONE_NEWCGROUP,
    CLONE_NEWUTS,
    CLONE_NEWIPC,
    CLONE_NEWUSER,
    CLONE_NEWPID,
    CLONE_NEWNET,
)
AF_UNIX = 1
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
# What makes a descriptor send "I/O is possible" signals, and to whom (fcntl(2), ioctl_list(2)).
F_SETFL, F_SETOWN, F_SETSIG, F_SETOWN_EX = 4, 8, 10, 15
FIOASYNC, FIOSETOWN, SIOCSPGRP = 0x5452, 0x8901, 0x8902
O_ASYNC = 0o20000
LOW_32 = 0xFFFFFFFF


@dataclass(frozen=True)
class Rule:
    """Deny `syscall` with `errno`, always or only `when` (argument index, SCMP_CMP_* op, datum a,
    datum b), and `also` when a second argument matches too (both must hold)."""

    syscall: str
    errno: int = errno.EPERM
    when: tuple[int, int, int, int] | None = None
    also: tuple[int, int, int, int] | None = None


def _bits_set(arg: int, bits: int) -> tuple[int, int, int, int]:
    return (arg, SCMP_CMP_MASKED_EQ, bits, bits)


def _low_32_equal(arg: int, value: int) -> tuple[int, int, int, int]:
    # `int`/`unsigned int` arguments: the kernel ignores the register's upper half, so the filter
    # must too, or a program sets a high bit and slips past an exact comparison.
    return (arg, SCMP_CMP_MASKED_EQ, LOW_32, value)


def _deny(*names: str) -> tuple[Rule, ...]:
    return tuple(Rule(name) for name in names)


DENYLIST: tuple[Rule, ...] = (
    # Kernel keyrings are per uid, not per namespace: a program could leave a key (an answer it
    # saw, a channel) for the next program of the same slot uid, and read the keys of other users.
    *_deny("add_key", "request_key", "keyctl"),
    # Reading or steering other processes: same-uid processes (the program's own children, a
    # later program of the slot) and descriptors pulled out of them.
    *_deny("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd"),
    # Namespaces and the filesystem view: the sandbox's namespaces and empty root are fixed by
    # the supervisor; a program must not make new ones (a user namespace hands out capabilities
    # inside it), join others, or remount and re-root. clone is denied only with a namespace flag
    # (one rule per flag; the rules of one syscall are ORed), so plain fork and threads work.
    *_deny("unshare", "setns", "mount", "umount2", "pivot_root", "chroot"),
    *_deny("open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr"),
    *(Rule("clone", when=_bits_set(0, flag)) for flag in CLONE_NAMESPACE_FLAGS),
    # clone3 passes its flags in memory the filter cannot read: ENOSYS makes glibc fall back to clone.
    Rule("clone3", errno.ENOSYS),
    # Large kernel attack surfaces a program never needs (the usual source of sandbox-escape bugs):
    # eBPF, perf counters (also a side channel), io_uring (runs syscalls the filter does not see),
    # userfaultfd (stalls the kernel mid-copy, a race-exploit tool).
    *_deny("bpf", "perf_event_open", "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd"),
    # Kernel code and boot: loading modules or a new kernel (need capabilities the program lacks; denied twice).
    *_deny("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module"),
    # Host-wide administration, likewise capability-gated already: time, swap, accounting, reboot,
    # the kernel log, port I/O, quotas, handles that bypass path lookup (the classic container escape).
    *_deny("settimeofday", "clock_settime", "swapon", "swapoff", "acct", "reboot", "syslog"),
    *_deny("iopl", "ioperm", "quotactl", "open_by_handle_at", "vhangup"),
    # personality can turn on READ_IMPLIES_EXEC or turn off address-space randomisation.
    Rule("personality"),
    # Pushing characters into a terminal's input (TIOCSTI) or reading the console (TIOCLINUX).
    Rule("ioctl", when=_low_32_equal(1, TIOCSTI)),
    Rule("ioctl", when=_low_32_equal(1, TIOCLINUX)),
    # Naming a signal owner for a descriptor: a program makes a pipe, names any pid or process group
    # its owner, sets SIGKILL as its I/O signal, turns on O_ASYNC and writes one byte; the kernel
    # then sends the signal with the program's credentials, past every `kill` rule. The pid
    # namespace hides outside pids in the full mode; the restricted mode has none, so every way in
    # is closed in both. fcntl64 exists only on 32-bit ABIs, which the filter kills outright.
    *(Rule("fcntl", when=_low_32_equal(1, command)) for command in (F_SETOWN, F_SETOWN_EX, F_SETSIG)),
    Rule("fcntl", when=_low_32_equal(1, F_SETFL), also=_bits_set(2, O_ASYNC)),
    *(Rule("ioctl", when=_low_32_equal(1, command)) for command in (FIOASYNC, FIOSETOWN, SIOCSPGRP)),
    # Sockets other than AF_UNIX: the empty network namespace has no route, but some families are
    # not namespaced at all (AF_VSOCK reaches the VM host) and netlink/packet sockets are attack surface.
    Rule("socket", when=(0, SCMP_CMP_NE, AF_UNIX, 0)),
    Rule("socketpair", when=(0, SCMP_CMP_NE, AF_UNIX, 0)),
)


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


_lib: ctypes.CDLL | None = None


def _libseccomp() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
        except OSError as exc:
            raise OSError(f"libseccomp.so.2 cannot be loaded ({exc})") from None
        lib.seccomp_init.argtypes = [ctypes.c_uint32]
        lib.seccomp_init.restype = ctypes.c_void_p
        lib.seccomp_release.argtypes = [ctypes.c_void_p]
        lib.seccomp_release.restype = None
        lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
        lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        lib.seccomp_rule_add_array.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.POINTER(_ArgCmp),
        ]
        lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
        _lib = lib
    return _lib


def _ok(rc: int, what: str) -> None:
    if rc < 0:  # libseccomp returns -errno
        raise OSError(-rc, f"libseccomp {what}: {os.strerror(-rc)}")


def syscall_number(name: str) -> int:
    """The native architecture's number for syscall `name`, as libseccomp knows it."""
    number = _libseccomp().seccomp_syscall_resolve_name(name.encode())
    if number == NR_SCMP_ERROR:
        raise ValueError(f"libseccomp does not know the syscall {name!r}")
    return number


def build_bpf(rules: tuple[Rule, ...] | None = None) -> bytes:
    """The filter for `rules` (default `DENYLIST`; everything else allowed) as raw BPF for the
    native architecture: 8-byte `struct sock_filter` instructions, ready for `Program`."""
    rules = DENYLIST if rules is None else rules
    lib = _libseccomp()
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError("libseccomp seccomp_init failed")
    try:
        _ok(lib.seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS), "attr_set(ACT_BADARCH)")
        # A binary search over syscall numbers instead of a linear chain: the kernel emulates the
        # filter for every syscall number when it is loaded (its allow-cache), so a shorter path
        # per number makes each program's load cheaper (~90 -> ~60 us here). Older libseccomp
        # lacks the attribute (EINVAL) and keeps the equivalent linear filter.
        rc = lib.seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, SCMP_OPTIMIZE_BINARY_TREE)
        if rc != -errno.EINVAL:
            _ok(rc, "attr_set(CTL_OPTIMIZE)")
        for rule in rules:
            number = syscall_number(rule.syscall)
            checks = [check for check in (rule.when, rule.also) if check is not None]
            conditions = (_ArgCmp * len(checks))(*(_ArgCmp(*check) for check in checks)) if checks else None
            action = 0x00050000 | (rule.errno & 0xFFFF)  # SCMP_ACT_ERRNO(errno)
            _ok(
                lib.seccomp_rule_add_array(ctx, action, number, len(checks), conditions),
                f"rule_add({rule.syscall})",
            )
        # 2.5.x exports only to a descriptor (seccomp_export_bpf_mem came in 2.6).
        fd = os.memfd_create("vprl-seccomp-bpf", os.MFD_CLOEXEC)
        try:
            _ok(lib.seccomp_export_bpf(ctx, fd), "export_bpf")
            size = os.lseek(fd, 0, os.SEEK_CUR)
            bpf = os.pread(fd, size, 0)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
    if not bpf or len(bpf) % ctypes.sizeof(_SockFilter) or len(bpf) != size:
        raise OSError(f"libseccomp exported {len(bpf)} bytes of BPF, not whole instructions")
    return bpf


class Program:
    """A BPF filter in the form prctl takes, prepared ahead so that loading it is one syscall."""

    def __init__(self, bpf: bytes) -> None:
        count, rest = divmod(len(bpf), ctypes.sizeof(_SockFilter))
        if rest or not 0 < count <= 4096:  # BPF_MAXINSNS
            raise ValueError(f"a seccomp filter is 1..4096 8-byte instructions, got {len(bpf)} bytes")
        self.bpf = bytes(bpf)
        self._code = (_SockFilter * count).from_buffer_copy(self.bpf)
        self._fprog = _SockFprog(count, self._code)
        self._address = ctypes.addressof(self._fprog)

    def __len__(self) -> int:
        return len(self._code)

    def load(self) -> None:
        """Filter this process (and everything it forks) for good. Needs NO_NEW_PRIVS or CAP_SYS_ADMIN."""
        if _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self._address, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")


_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

# The filter every sandbox program loads; set by the supervisor before it forks any sandbox, and
# so present in every sandbox's copy of memory.
_armed: Program | None = None


def arm(bpf: bytes | None) -> None:
    """In the supervisor: the filter sandboxes load from now on (None: no filter)."""
    global _armed
    _armed = Program(bpf) if bpf is not None else None


def armed() -> Program | None:
    return _armed


def load_armed() -> None:
    """In a sandbox program process, last step of its set-up: load the armed filter, if any."""
    if _armed is not None:
        _armed.load()


def mode() -> int:
    """This process's seccomp mode (0 none, 2 filter)."""
    return _prctl(PR_GET_SECCOMP, 0, 0, 0, 0)
