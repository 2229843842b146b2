"""Which isolation layers work on this machine: probed in a throwaway child at supervisor start.

Every layer is tried for real (a namespace is created, a chroot entered, a uid dropped) rather
than inferred from the kernel version or from being root.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import resource
import signal
import tempfile
from collections.abc import Callable
from typing import Any

from vprl.executor.sandbox import seccomp, syscalls

LAYERS: tuple[str, ...] = (
    "netns",
    "mountns",
    "ipcns",
    "utsns",
    "pidns",
    "no_network",
    "chroot",
    "uid",
    "pdeathsig_after_setuid",
    "no_new_privs",
    "rlimits",
    "seccomp",
)

_ROOT_FIX = (
    "run the executor as root (or with CAP_SYS_ADMIN, CAP_SYS_CHROOT, CAP_SETUID and CAP_SETGID); as a "
    "non-root user this needs user namespaces, which Ubuntu 23.10+ blocks unless "
    "`sysctl kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile allows them"
)
FIXES: dict[str, str] = {
    **{name: _ROOT_FIX + f" (unshare of the {name[:-2]} namespace failed)" for name in syscalls.NAMESPACES},
    "no_network": "the network namespace still reaches a network: check that unshare(CLONE_NEWNET) is not "
    "being intercepted (seccomp or a container runtime)",
    "chroot": _ROOT_FIX + " (chroot needs CAP_SYS_CHROOT)",
    "uid": _ROOT_FIX + " (switching to the per-slot uids 60000+ needs CAP_SETUID/CAP_SETGID)",
    "pdeathsig_after_setuid": "the kernel did not keep PR_SET_PDEATHSIG after it was re-armed; sandboxes could "
    "outlive the supervisor",
    "no_new_privs": "prctl(PR_SET_NO_NEW_PRIVS) failed; the kernel is older than 3.5 or a policy blocks prctl",
    "rlimits": "setrlimit failed; a container may forbid lowering the hard limits",
    "seccomp": "install libseccomp (`apt-get install libseccomp2`, which provides libseccomp.so.2) and run on a "
    "kernel built with CONFIG_SECCOMP_FILTER (check `grep Seccomp /proc/self/status`); a container runtime's own "
    "seccomp profile must allow prctl(PR_SET_SECCOMP)",
}


def probe_layers(uid: int = 60000 + 999) -> dict[str, str]:
    """`{layer: "ok" | reason}` for every layer in `LAYERS`, from a forked child."""
    root = tempfile.mkdtemp(prefix="vprl-probe-")
    os.chmod(root, 0o555)
    report = in_forked_child(lambda: _probe_in_child(root, uid))
    os.rmdir(root)
    return {name: report.get(name, report.get("_error", "not probed")) for name in LAYERS}


def in_forked_child(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run `fn` in a forked child (what it changes there, a namespace or a filter, stays there) and
    return the JSON dict it returns, or `{"_error": repr(exception)}`."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read_fd)
        try:
            out = fn()
        except BaseException as exc:  # noqa: BLE001 — reported, and the caller decides what it means
            out = {"_error": repr(exc)}
        os.write(write_fd, json.dumps(out).encode())
        os._exit(0)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b"{}")


def _try(report: dict[str, str], name: str, fn) -> bool:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 — any failure means the layer is missing; the reason is reported
        report[name] = f"{type(exc).__name__}: {exc}"
        return False
    report[name] = "ok"
    return True


def _probe_in_child(root: str, uid: int) -> dict[str, str]:
    report: dict[str, str] = {}
    # First: libseccomp.so.2 can still be opened (no chroot yet), and the check forks, which the
    # pid namespace below no longer allows once its short-lived PID 1 is gone.
    _try(report, "seccomp", lambda: _check_seccomp(uid))
    for name, flag in syscalls.NAMESPACES.items():
        _try(report, name, lambda flag=flag: syscalls.unshare(flag))
    if report["netns"] == "ok":
        _try(report, "no_network", _check_no_network)
    else:
        report["no_network"] = "no network namespace"
    if report["pidns"] == "ok":
        _try(report, "pidns", _check_pid_one)
    _try(report, "chroot", lambda: (os.chroot(root), os.chdir("/"), _expect(os.listdir("/") == [], "root not empty")))

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (16, 16))

    _try(report, "rlimits", limits)

    def drop() -> None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        _expect(os.getuid() == uid and os.geteuid() == uid, "uid did not change")
        try:
            os.setuid(0)
        except PermissionError:
            return
        raise RuntimeError("could switch back to root after dropping the uid")

    if _try(report, "uid", drop):
        _try(
            report,
            "pdeathsig_after_setuid",
            lambda: (
                syscalls.set_pdeathsig(signal.SIGKILL),
                _expect(syscalls.get_pdeathsig() == signal.SIGKILL, "PDEATHSIG not set"),
            ),
        )
    else:
        report["pdeathsig_after_setuid"] = "uid layer missing"
    _try(report, "no_new_privs", syscalls.set_no_new_privs)
    return report


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise RuntimeError(message)


def _check_no_network() -> None:
    import socket  # only in this throwaway child: the supervisor itself never imports socket

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 53))  # TEST-NET-1: connecting a UDP socket needs only a route
    except OSError:
        return
    finally:
        s.close()
    raise RuntimeError("a route to the outside exists inside the network namespace")


def _check_seccomp(uid: int) -> None:
    """Build the filter and load it in a forked child as a sandbox program does (after the uid drop,
    when root, and NO_NEW_PRIVS; a loaded filter can never be taken off), then see keyctl and
    add_key denied while a plain fork still works."""
    program = seccomp.Program(seccomp.build_bpf())
    keyctl, add_key = seccomp.syscall_number("keyctl"), seccomp.syscall_number("add_key")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the grandchild
        os.close(read_fd)
        try:
            # uid 0 without CAP_SETUID/CAP_SETGID (a container that drops every capability) cannot
            # drop: it loads the filter as itself, as any unprivileged user does.
            if os.geteuid() == 0:
                with contextlib.suppress(PermissionError):
                    os.setgroups([])
                    os.setgid(uid)
                    os.setuid(uid)
            syscalls.set_no_new_privs()
            program.load()
            libc = ctypes.CDLL(None, use_errno=True)
            for name, args in (
                ("keyctl", (keyctl, 0, -4, 1)),
                ("add_key", (add_key, b"user", b"vprl-probe", b"x", 1, -3)),
            ):
                if libc.syscall(*args) != -1 or ctypes.get_errno() != errno.EPERM:
                    raise RuntimeError(f"{name} was not denied with EPERM (errno {ctypes.get_errno()})")
            child = os.fork()
            if child == 0:
                os._exit(7)
            _expect(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 7, "plain fork fails under the filter")
            message = "ok"
        except BaseException as exc:  # noqa: BLE001 — sent to the probe, which reports the layer missing
            message = f"{type(exc).__name__}: {exc}"
        os.write(write_fd, message.encode())
        os._exit(0)
    os.close(write_fd)
    message = os.read(read_fd, 4096).decode() or "the seccomp check died"
    os.close(read_fd)
    os.waitpid(pid, 0)
    _expect(message == "ok", message)


def _check_pid_one() -> None:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the grandchild
        os._exit(0 if os.getpid() == 1 else 1)
    _, status = os.waitpid(pid, 0)
    _expect(os.waitstatus_to_exitcode(status) == 0, "the first child of the new pid namespace is not PID 1")


def missing_layers(report: dict[str, str], required: tuple[str, ...] = LAYERS) -> list[str]:
    return [name for name in required if report.get(name) != "ok"]


def explain_missing(report: dict[str, str], required: tuple[str, ...] = LAYERS) -> str:
    lines = [
        f"  - {name}: {report.get(name, 'unknown layer')}; fix: {FIXES.get(name, f'valid layers are {list(LAYERS)}')}"
        for name in missing_layers(report, required)
    ]
    return (
        "the sandbox cannot start because isolation layers are missing:\n"
        + "\n".join(lines)
        + "\n(`sandbox: restricted`, or `auto`, runs programs without namespaces and says what that gives up: "
        "docs/design-notes.md#the-sandbox-without-namespaces; `--sandbox none` runs programs in-process WITHOUT "
        "isolation, for debugging only)"
    )
