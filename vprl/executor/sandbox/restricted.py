"""The sandbox without namespaces ("restricted"): its layers here, when `auto` picks it, and the one
line that says what it gives up (docs/design-notes.md#the-sandbox-without-namespaces).

Many GPU nodes forbid namespaces: Slurm jobs run as an unprivileged user, container runtimes deny
unshare and clone's namespace flags, and Ubuntu 23.10+ blocks unprivileged user namespaces. There
the restricted sandbox still runs each program in a fresh process forked from the lean supervisor,
under rlimits, NO_NEW_PRIVS and a stricter seccomp filter (restricted_filter.py), with the file
system walled off by chroot (where the supervisor is root) and/or Landlock (landlock.py). It needs
seccomp, NO_NEW_PRIVS, rlimits and one of chroot or Landlock; everything else is used where the
probe finds it (chroot and a uid of each slot's own only as root).
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from dataclasses import dataclass, field

from vprl.executor.sandbox import landlock, restricted_filter, seccomp, syscalls
from vprl.executor.sandbox.probe import FIXES, explain_missing, in_forked_child, missing_layers

DOC = "docs/design-notes.md#the-sandbox-without-namespaces"
NAMESPACE_LAYERS = ("netns", "mountns", "ipcns", "utsns", "pidns", "no_network")
# The full mode's layers the restricted one can do without: `auto` falls back to it only when
# nothing else is missing (with no seccomp, say, it could not start either).
DOES_WITHOUT = frozenset((*NAMESPACE_LAYERS, "chroot", "uid", "pdeathsig_after_setuid"))
RESTRICTED_LAYERS = ("landlock", "seccomp_restricted")
NEEDS = ("seccomp_restricted", "no_new_privs", "rlimits")
RESTRICTED_FIXES = {
    "landlock": "boot Linux >= 5.13 with `landlock` in the `lsm=` list (see /sys/kernel/security/lsm), or run "
    "the executor as root so that chroot confines programs instead",
    "seccomp_restricted": FIXES["seccomp"],
}


@dataclass(frozen=True)
class Plan:
    """How this machine's restricted sandboxes are made."""

    chroot: bool  # into the supervisor's empty root (root only)
    setuid: bool  # to a uid of the slot's own (root only); else the supervisor's uid
    landlock_abi: int  # 0: no Landlock
    numbers: dict[str, int] = field(default_factory=dict)  # syscalls of the per-program pid filter


def probe_layers() -> dict[str, str]:
    """`{"landlock": ..., "seccomp_restricted": ...}`, each "ok" or the reason, tried for real in
    forked children."""
    report: dict[str, str] = {}
    for name, check in (("landlock", _check_landlock), ("seccomp_restricted", _check_filter)):
        try:
            check()
        except Exception as exc:  # noqa: BLE001 — any failure means the layer is missing; the reason is reported
            report[name] = f"{type(exc).__name__}: {exc}"
        else:
            report[name] = "ok"
    return report


def _ok(layers: dict[str, str], name: str) -> bool:
    return layers.get(name) == "ok"


def plan(layers: dict[str, str]) -> Plan:
    return Plan(
        chroot=_ok(layers, "chroot"),
        setuid=_ok(layers, "uid") and _ok(layers, "pdeathsig_after_setuid"),
        # The empty chroot already hides every file; Landlock would only turn its empty listing
        # into a PermissionError.
        landlock_abi=landlock.abi_version() if _ok(layers, "landlock") and not _ok(layers, "chroot") else 0,
        numbers=restricted_filter.pid_numbers(),
    )


def restricted_missing(layers: dict[str, str]) -> list[str]:
    missing = [name for name in NEEDS if not _ok(layers, name)]
    if not _ok(layers, "landlock") and not _ok(layers, "chroot"):
        missing.append("landlock")
    return missing


def choose(asked: str, layers: dict[str, str], required: tuple[str, ...]) -> tuple[str, str | None]:
    """`(isolation, None)` with isolation "full" or "restricted", or `("", why not)`. `asked` is the
    config's `sandbox`: "full" and "restricted" are taken as asked; "auto" is "full" where every
    required layer works, and "restricted" where only layers it does without are missing."""
    full_missing = missing_layers(layers, required)
    if asked == "full" or (asked == "auto" and not full_missing):
        return ("", explain_missing(layers, required)) if full_missing else ("full", None)
    if asked == "auto" and not DOES_WITHOUT.issuperset(full_missing):
        return "", explain_missing(layers, required)
    problems = restricted_missing(layers)
    if not problems:
        return "restricted", None
    lines = [
        f"  - {name}: {layers.get(name, 'not probed')}; fix: {RESTRICTED_FIXES.get(name) or FIXES[name]}"
        for name in problems
    ]
    head = "the restricted sandbox (no namespaces) cannot start: it lacks\n" + "\n".join(lines)
    if asked == "auto":
        head = f"{explain_missing(layers, required)}\nand {head}"
    return "", head


def gives_up(p: Plan) -> list[str]:
    """What programs lose against the full sandbox, one phrase each (the doc lists them in full)."""
    out = ["a pid namespace (they see real pids and can tell which exist; fork is denied instead)"]
    if not p.chroot:
        out.append("an empty root (Landlock denies opening anything, but stat still sees the host's paths)")
    if not p.setuid:
        out.append(f"a uid of their own (they run as the supervisor's uid {os.getuid()})")
    return out


def notice(asked: str, layers: dict[str, str], p: Plan) -> str:
    """The one line that announces the restricted sandbox."""
    if asked == "restricted":
        why = "as asked"
    else:
        first = next(name for name in (*NAMESPACE_LAYERS, "chroot", "uid") if not _ok(layers, name))
        why = f"because namespaces are unavailable here ({first}: {layers.get(first)})"
    walls = [name for name, on in (("chroot", p.chroot), (f"Landlock ABI {p.landlock_abi}", p.landlock_abi)) if on]
    return (
        f"sandbox: programs run in the restricted sandbox, without namespaces, {why}; files walled off by "
        f"{' and '.join(walls)}; it gives up {'; '.join(gives_up(p))}; see {DOC}"
    )


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise RuntimeError(message)


def _check_landlock() -> None:
    abi = landlock.require()

    def walled() -> dict[str, str]:
        syscalls.set_no_new_privs()
        landlock.deny_everything(abi)
        for what, attempt in (("list /", lambda: os.listdir("/")), ("read /proc/self/status", _read_status)):
            try:
                attempt()
            except PermissionError:
                continue
            raise RuntimeError(f"Landlock ABI {abi} let the sandbox {what}")
        return {"ok": "ok"}

    out = in_forked_child(walled)
    _expect("_error" not in out, str(out.get("_error")))


def _read_status() -> None:
    with open("/proc/self/status") as fh:
        fh.read()


def _check_filter() -> None:
    """Load both filters in a forked child as a sandbox does, and see them deny what the namespaces
    used to hold while a thread still starts."""
    rules = seccomp.Program(restricted_filter.build_rules_bpf())
    numbers = restricted_filter.pid_numbers()

    def filtered() -> dict[str, str]:
        syscalls.set_no_new_privs()
        rules.load()
        seccomp.Program(restricted_filter.pid_filter(os.getpid(), numbers)).load()
        libc = ctypes.CDLL(None, use_errno=True)
        _expect(libc.socket(1, 1, 0) == -1 and ctypes.get_errno() == errno.EPERM, "an AF_UNIX socket was allowed")
        _expect(libc.syscall(restricted_filter.REVIEWED_UP_TO + 1) == -1 and ctypes.get_errno() == errno.ENOSYS,
                "a syscall newer than the reviewed table was not ENOSYS")  # fmt: skip
        for what, attempt in (
            ("fork", lambda: os.fork() or os._exit(0)),  # a fork that got through: its child leaves
            ("signalling the parent", lambda: os.kill(os.getppid(), 0)),
            ("opening a file to write", lambda: os.open("/dev/null", os.O_WRONLY)),
        ):
            try:
                attempt()
            except PermissionError:
                continue
            raise RuntimeError(f"{what} was not denied")
        os.kill(os.getpid(), 0)  # itself: allowed
        ran: list[int] = []
        thread = threading.Thread(target=ran.append, args=(1,))
        thread.start()
        thread.join()
        _expect(ran == [1], "a thread does not start under the filter")
        return {"ok": "ok"}

    out = in_forked_child(filtered)
    _expect("_error" not in out, str(out.get("_error")))
