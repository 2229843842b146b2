"""The restricted sandbox's two seccomp filters (docs/design-notes.md#the-sandbox-without-namespaces).

Without namespaces the filter has to hold what the namespaces held, so the restricted mode loads
two filters on top of each other (the kernel runs both; the stricter answer wins):

- `RULES`, built once by the supervisor with libseccomp like the full mode's (seccomp.py): the full
  denylist, minus its AF_UNIX exception, plus everything a program could use to reach the host
  from the host's own namespaces (sockets of any family, new processes, file writes and metadata
  changes, SysV IPC and POSIX message queues, other processes' scheduling, file watching);
- `pid_filter(pid)`, assembled by hand in each sandbox for its own pid, because a rule that
  depends on the pid cannot be built once: signals, rlimits and scheduling changes are allowed on
  the program itself only, and PDEATHSIG cannot be cleared. It also answers ENOSYS to every
  syscall newer than this file was reviewed against (`REVIEWED_UP_TO`), so that a kernel's new
  calls are refused until someone has looked at them, instead of allowed by a denylist that
  predates them.
"""

from __future__ import annotations

import errno
import os
import struct

from vprl.executor.sandbox import seccomp
from vprl.executor.sandbox.seccomp import Rule

CLONE_THREAD = 0x00010000
# open(2)/openat(2) flags that write or create (O_APPEND and O_TMPFILE need one of the first two).
WRITE_FLAGS = (os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC)
PR_SET_PDEATHSIG = 1
# The newest syscall number the tables here were checked against: map_shadow_stack (Linux 6.6).
# Anything newer (statmount, listmount, mseal, setxattrat, file_setattr, ...) gets ENOSYS.
REVIEWED_UP_TO = 453


def _deny(*names: str, code: int = errno.EPERM) -> tuple[Rule, ...]:
    return tuple(Rule(name, code) for name in names)


def _bits_set(arg: int, bits: int) -> tuple[int, int, int, int]:
    return (arg, seccomp.SCMP_CMP_MASKED_EQ, bits, bits)


EXTRA: tuple[Rule, ...] = (
    # No network namespace: a socket of any family would reach the host's network, its abstract
    # unix sockets, or a pathname socket such as the user's D-Bus or systemd (which run commands).
    # The program's channel is pipes it already holds, so it needs no socket at all.
    *_deny("socket", "socketpair"),
    # No pid namespace: a child could outlive the program (setsid and double fork), and nothing
    # would kill it with the program. So no new processes; threads (CLONE_THREAD) still work,
    # and die with the process. Exec would only swap the interpreter for something unfiltered by
    # our Python-level checks, so it goes too.
    Rule("clone", when=(0, seccomp.SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0)),
    *_deny("fork", "vfork", "execve", "execveat"),
    # No empty read-only root when not root: no writes, creations, removals or renames anywhere
    # (Landlock says the same; this holds even where only chroot confines reads).
    *(Rule("open", when=_bits_set(1, bit)) for bit in WRITE_FLAGS),
    *(Rule("openat", when=_bits_set(2, bit)) for bit in WRITE_FLAGS),
    Rule("openat2", errno.ENOSYS),  # its flags are in memory the filter cannot read; glibc falls back
    *_deny("creat", "truncate", "rename", "renameat", "renameat2", "unlink", "unlinkat", "rmdir"),
    *_deny("mkdir", "mkdirat", "link", "linkat", "symlink", "symlinkat", "mknod", "mknodat"),
    # Metadata, which Landlock does not guard: with the trainer's uid a program could chmod,
    # chown, re-date or tag the user's own files.
    *_deny("chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat"),
    *_deny("utime", "utimes", "utimensat", "futimesat"),
    *_deny("setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr"),
    # No ipc namespace: the host's SysV segments and queues (the trainer's uid owns some) and POSIX
    # message queues.
    *_deny("shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl"),
    *_deny("semget", "semop", "semtimedop", "semctl"),
    *_deny("mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr"),
    # Other processes of the same uid (pid_filter covers the calls a program may make on itself).
    *_deny("pidfd_open", "pidfd_send_signal", "process_madvise", "process_mrelease", "get_robust_list"),
    *_deny("migrate_pages", "move_pages", "setpriority", "ioprio_set"),
    # Watching or naming host files: a side channel on what the trainer reads, and handles to them.
    *_deny("inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark"),
    *_deny("name_to_handle_at", "quotactl_fd"),
)

RULES: tuple[Rule, ...] = (
    *(rule for rule in seccomp.DENYLIST if rule.syscall not in ("socket", "socketpair")),
    *EXTRA,
)

# The pid-bound calls: which argument is the pid, and which values besides the program's own pid
# are allowed (0 is "myself" for prlimit64 and the sched_* calls, "my process group" for kill).
SELF_ONLY = ("tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
SELF_OR_ZERO = ("prlimit64", "sched_setaffinity", "sched_setparam", "sched_setscheduler", "sched_setattr")

# struct seccomp_data: nr, arch, instruction pointer, args[6] (u64 each, the low half first on the
# little-endian machines this supports).
_NR, _ARCH, _ARG0_LOW = 0, 4, 16
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_LD_ABS, _JEQ, _JGT, _RET = 0x20, 0x15, 0x25, 0x06
ALLOW = 0x7FFF0000
KILL_PROCESS = 0x80000000


def _errno(code: int) -> int:
    return 0x00050000 | code


class _Asm:
    """Just enough of a BPF assembler: conditional jumps to labels, resolved at the end."""

    def __init__(self) -> None:
        self.code: list[tuple[int, object, object, int]] = []
        self.labels: dict[str, int] = {}

    def load(self, offset: int) -> None:
        self.code.append((_LD_ABS, 0, 0, offset))

    def jump_if(self, op: int, k: int, target: str) -> None:
        self.code.append((op, target, 0, k & 0xFFFFFFFF))

    def ret(self, action: int) -> None:
        self.code.append((_RET, 0, 0, action))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def assemble(self) -> bytes:
        out = bytearray()
        for at, (code, jt, jf, k) in enumerate(self.code):
            if isinstance(jt, str):
                jt = self.labels[jt] - at - 1
                if not 0 <= jt <= 255:
                    raise ValueError(f"BPF jump of {jt} instructions")
            out += struct.pack("=HBBI", code, jt, jf, k)
        return bytes(out)


def pid_numbers() -> dict[str, int]:
    """The native numbers `pid_filter` needs, resolved once by the supervisor (libseccomp)."""
    names = ("kill", "prctl", *SELF_ONLY, *SELF_OR_ZERO)
    return {name: seccomp.syscall_number(name) for name in names}


def pid_filter(pid: int, numbers: dict[str, int]) -> bytes:
    """The per-program filter for process `pid` (see the module doc), as raw BPF."""
    arch = AUDIT_ARCH.get(os.uname().machine)
    if arch is None:
        raise OSError(f"the restricted sandbox's pid filter is not written for {os.uname().machine}")
    asm = _Asm()
    asm.load(_ARCH)
    asm.jump_if(_JEQ, arch, "native")
    asm.ret(KILL_PROCESS)
    asm.label("native")
    asm.load(_NR)
    asm.jump_if(_JGT, REVIEWED_UP_TO, "unreviewed")
    asm.jump_if(_JEQ, numbers["kill"], "kill")
    asm.jump_if(_JEQ, numbers["prctl"], "prctl")
    for name in SELF_ONLY:
        asm.jump_if(_JEQ, numbers[name], "self")
    for name in SELF_OR_ZERO:
        asm.jump_if(_JEQ, numbers[name], "self_or_zero")
    asm.ret(ALLOW)
    asm.label("unreviewed")
    asm.ret(_errno(errno.ENOSYS))
    asm.label("kill")  # itself, its process group (0 or -pid: it is a session leader with no children)
    asm.load(_ARG0_LOW)
    asm.jump_if(_JEQ, -pid, "allow")
    asm.label("self_or_zero")
    asm.load(_ARG0_LOW)
    asm.jump_if(_JEQ, 0, "allow")
    asm.label("self")
    asm.load(_ARG0_LOW)
    asm.jump_if(_JEQ, pid, "allow")
    asm.ret(_errno(errno.EPERM))
    asm.label("prctl")  # PDEATHSIG is what kills the program when the supervisor dies
    asm.load(_ARG0_LOW)
    asm.jump_if(_JEQ, PR_SET_PDEATHSIG, "deny")
    asm.label("allow")
    asm.ret(ALLOW)
    asm.label("deny")
    asm.ret(_errno(errno.EPERM))
    return asm.assemble()


def build_rules_bpf() -> bytes:
    """The shared filter (`RULES`), built with libseccomp."""
    return seccomp.build_bpf(RULES)
