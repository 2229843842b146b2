"""The restricted sandbox's parts on this machine: its two filters and Landlock (each in a forked
child), its probe, the choice `auto` makes, and the mode forced where namespaces do work."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import resource
import threading

import pytest
from test_sandbox import CANARY, make_world
from test_seccomp import SIGNAL_OWNER_DENIED, signal_owner_calls

from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.executor.sandbox import landlock, probe, restricted, restricted_filter, seccomp, syscalls
from vprl.executor.sandbox.probe import LAYERS

OK = {name: "ok" for name in (*LAYERS, *restricted.RESTRICTED_LAYERS)}
NO_NAMESPACES = {**OK, **{name: "PermissionError: [Errno 1]" for name in restricted.NAMESPACE_LAYERS}}
UNPRIVILEGED = {**NO_NAMESPACES, "chroot": "PermissionError", "uid": "PermissionError", "pdeathsig_after_setuid": "x"}


def errno_of(result: int) -> int:
    return ctypes.get_errno() if result == -1 else -1000 - result  # a success shows up as <= -1000


def test_the_filters_deny_what_the_namespaces_held_and_allow_the_program_itself():
    rules = seccomp.Program(restricted_filter.build_rules_bpf())
    numbers = restricted_filter.pid_numbers()
    libc = ctypes.CDLL(None, use_errno=True)

    def checks() -> dict:
        syscalls.set_no_new_privs()
        rules.load()
        seccomp.Program(restricted_filter.pid_filter(os.getpid(), numbers)).load()
        out = {}
        for name, target in (("kill_parent", os.getppid()), ("kill_all", -1), ("kill_init", 1)):
            out[name] = errno_of(libc.kill(target, 0))
        out["kill_self"] = errno_of(libc.kill(os.getpid(), 0))
        out["kill_own_group"] = errno_of(libc.kill(0, 0))
        out["prlimit_parent"] = errno_of(libc.prlimit64(os.getppid(), resource.RLIMIT_NOFILE, None, None))
        out["prlimit_self"] = errno_of(libc.prlimit64(0, resource.RLIMIT_NOFILE, None, None))
        out["set_pdeathsig"] = errno_of(libc.prctl(1, 0, 0, 0, 0))
        out["get_pdeathsig"] = errno_of(libc.prctl(2, ctypes.byref(ctypes.c_int()), 0, 0, 0))
        out["unreviewed"] = errno_of(libc.syscall(restricted_filter.REVIEWED_UP_TO + 1, 0, 0, 0))
        out["socket_unix"] = errno_of(libc.socket(1, 1, 0))
        out["fork"] = errno_of(libc.syscall(seccomp.syscall_number("fork")))
        out["open_read"] = os.open("/dev/null", os.O_RDONLY) >= 0
        for flag in ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC"):
            out[flag] = errno_of(libc.open(b"/dev/null", getattr(os, flag), 0o600))
        out["chmod"] = errno_of(libc.chmod(b"/nonexistent-vprl", 0o666))  # ENOENT had it got through
        out["shmget"] = errno_of(libc.shmget(0, 4096, 0o1600))
        ran = []
        thread = threading.Thread(target=ran.append, args=(1,))
        thread.start()
        thread.join()
        out["thread"] = ran
        return out

    out = probe.in_forked_child(checks)
    assert "_error" not in out, out
    denied = ["kill_parent", "kill_all", "kill_init", "prlimit_parent", "set_pdeathsig", "socket_unix", "fork"]
    denied += ["O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "chmod", "shmget"]
    assert {name: out[name] for name in denied} == dict.fromkeys(denied, errno.EPERM)
    assert out["unreviewed"] == errno.ENOSYS
    assert [out[n] for n in ("kill_self", "kill_own_group", "prlimit_self", "get_pdeathsig")] == [-1000] * 4
    assert out["open_read"] is True and out["thread"] == [1]


def test_item_1_restricted_filters_deny_every_signal_owner():
    """#37 item 1: without a pid namespace the program sees real pids, so an I/O signal owner is
    the one way left past the pid filter's `kill` rules: F_SETOWN and kin are refused."""
    rules = seccomp.Program(restricted_filter.build_rules_bpf())
    numbers = restricted_filter.pid_numbers()

    def checks() -> dict:
        syscalls.set_no_new_privs()
        rules.load()
        seccomp.Program(restricted_filter.pid_filter(os.getpid(), numbers)).load()
        return signal_owner_calls()

    out = probe.in_forked_child(checks)
    assert "_error" not in out, out
    assert {name: out[name] for name in SIGNAL_OWNER_DENIED} == dict.fromkeys(SIGNAL_OWNER_DENIED, errno.EPERM)
    assert out["f_setfl_nonblock"] <= -1000 and out["f_getown"] <= -1000 and out["f_dupfd"] is True


def test_landlock_walls_off_files_but_not_their_names(tmp_path):
    abi = landlock.require()
    secret = tmp_path / "labels.json"
    secret.write_text("the answers")
    keep = os.open(str(secret), os.O_RDONLY)

    def checks() -> dict:
        syscalls.set_no_new_privs()
        landlock.deny_everything(abi)
        out = {}
        for name, attempt in (
            ("read", secret.read_text),
            ("list", lambda: os.listdir(tmp_path)),
            ("write", lambda: (tmp_path / "new").write_text("x")),
            ("remove", lambda: os.unlink(secret)),
            ("exec", lambda: os.execv("/bin/true", ["true"])),
        ):
            try:
                attempt()
                out[name] = "allowed"
            except OSError as exc:
                out[name] = errno.errorcode[exc.errno]
        out["stat_size"] = os.stat(secret).st_size  # what it gives up: names and metadata stay visible
        out["held_before"] = os.pread(keep, 3, 0).decode()  # descriptors opened before stay usable
        return out

    out = probe.in_forked_child(checks)
    os.close(keep)
    assert out == {
        "read": "EACCES",
        "list": "EACCES",
        "write": "EACCES",
        "remove": "EACCES",
        "exec": "EACCES",
        "stat_size": len("the answers"),
        "held_before": "the",
    }, out


def test_probe_finds_both_restricted_layers_here():
    assert restricted.probe_layers() == {"landlock": "ok", "seccomp_restricted": "ok"}


def test_probe_fails_a_filter_that_lets_sockets_through(monkeypatch):
    rules = tuple(r for r in restricted_filter.RULES if r.syscall != "socket")
    monkeypatch.setattr(restricted_filter, "RULES", rules)
    assert "an AF_UNIX socket was allowed" in restricted.probe_layers()["seccomp_restricted"]


@pytest.mark.parametrize(
    "asked, layers, required, chosen",
    [
        ("auto", OK, LAYERS, "full"),
        ("auto", NO_NAMESPACES, LAYERS, "restricted"),
        ("auto", UNPRIVILEGED, LAYERS, "restricted"),
        ("restricted", OK, LAYERS, "restricted"),
        ("full", OK, LAYERS, "full"),
        ("auto", NO_NAMESPACES, ("seccomp", "no_new_privs"), "full"),  # namespaces not required: full it is
    ],
)
def test_auto_chooses_full_where_it_can_and_restricted_where_only_namespaces_lack(asked, layers, required, chosen):
    assert restricted.choose(asked, layers, required) == (chosen, None)


@pytest.mark.parametrize(
    "asked, layers, named",
    [
        ("full", NO_NAMESPACES, ["netns", "`sandbox: restricted`"]),  # an explicit full never falls back
        ("auto", {**NO_NAMESPACES, "seccomp": "OSError: libseccomp.so.2"}, ["seccomp: OSError"]),
        ("auto", {**UNPRIVILEGED, "landlock": "OSError: [Errno 38]"}, ["landlock: OSError", "cannot start"]),
        (
            "restricted",
            {**OK, "no_new_privs": "x", "seccomp_restricted": "y"},
            ["no_new_privs: x", "seccomp_restricted: y"],
        ),
    ],
)
def test_refusals_name_what_is_missing(asked, layers, named):
    chosen, message = restricted.choose(asked, layers, LAYERS)
    assert chosen == "" and all(part in message for part in named), message


def test_what_it_gives_up_depends_on_root():
    unprivileged = restricted.gives_up(restricted.Plan(chroot=False, setuid=False, landlock_abi=4))
    assert [item.split(" (")[0] for item in unprivileged] == ["a pid namespace", "an empty root", "a uid of their own"]
    as_root = restricted.gives_up(restricted.Plan(chroot=True, setuid=True, landlock_abi=0))
    assert [item.split(" (")[0] for item in as_root] == ["a pid namespace"]


def test_the_mode_can_be_forced_where_namespaces_work(tmp_path, caplog):
    host, examples = make_world(tmp_path)
    with (
        caplog.at_level(logging.WARNING, logger="vprl.executor"),
        SyncRunner(host, RunnerConfig(slots=2, timeout_s=2.0, sandbox="restricted")) as runner,
    ):
        assert runner.runner.isolation == "restricted" and runner.runner.supervisor.spawn == "plain"
        result = runner.run([(examples[0], CANARY)])[0]
    assert result.status == "ok", result
    facts = result.answer
    assert 60000 <= facts["uid"] < 61000 and facts["pid"] != 1  # a slot's uid, in the host's pid namespace
    assert facts["root"] == [] and facts["env"] == [] and facts["fds"] == [0, 1, 2, 3, 4]
    assert facts["setuid0"] is False and facts["socket"] == "absent" and facts["fsize"] == 0
    (line,) = [r.getMessage() for r in caplog.records if r.name == "vprl.executor.runner"]
    assert "restricted sandbox, without namespaces, as asked; files walled off by chroot;" in line


def test_auto_runs_the_full_sandbox_here_without_a_word(tmp_path, caplog):
    host, examples = make_world(tmp_path)
    with caplog.at_level(logging.WARNING, logger="vprl.executor"), SyncRunner(host, RunnerConfig(slots=1)) as runner:
        assert runner.runner.isolation == "full"
        assert runner.run([(examples[0], CANARY)])[0].answer["pid"] == 1
    assert [r for r in caplog.records if r.name.startswith("executor")] == []


def test_an_unknown_mode_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"sandbox must be one of \('auto', 'full', 'restricted', 'none'\)"):
        RunnerConfig(sandbox="namespaces-off")
