"""The hostile probes against the sandbox without namespaces, on the two kinds of node it is for.

Each node is made from this machine by tests/restricted_suite.py, in a process of its own: an
unprivileged user (every capability dropped: no namespaces, chroot or uid change) and a container's
root (namespaces denied by seccomp, chroot and setuid left). Both run with `sandbox: auto`, so the
executor has to find out for itself that namespaces are unavailable, choose the restricted sandbox
and say so in one line. Every probe of tests/hostile_probes.py runs, plus the probes only a
namespace-free sandbox needs (the trainer's uid and processes in reach); a probe whose guarantee the
mode gives up is skipped with the guarantee it tests, and `test_skips_are_exactly_the_dropped_guarantees`
fails the moment a skipped probe would pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_probes import PROBES, PWNED, TIMEOUT, no_secret
from node_kinds import UNPRIVILEGED
from restricted_suite import extra_probes

from vprl.executor.results import ExecutionResult

HELPER = str(Path(__file__).resolve().parent / "restricted_suite.py")
ALL = PROBES + extra_probes(0, "/nonexistent")
FORK = (
    "a pid namespace to fork in: without one a program's children could outlive it (setsid, double fork), so "
    "the restricted sandbox denies fork instead (probes fork_denied, clone_process_denied); threads still work"
)
EMPTY_ROOT = (
    "an empty root: without root there is no chroot, so / is the host's, walled off by Landlock; listing it is "
    "denied (PermissionError) instead of empty (probes read_the_labels, read_passwd, proc_environ)"
)
SKIPS = {
    "unprivileged": {"list_root": EMPTY_ROOT, "setsid_daemon": FORK, "plain_fork_still_works": FORK},
    # Landlock without signal scoping (#37): the seccomp filter alone must hold the signal probes.
    "unprivileged_landlock_5": {"list_root": EMPTY_ROOT, "setsid_daemon": FORK, "plain_fork_still_works": FORK},
    "container_root": {"setsid_daemon": FORK, "plain_fork_still_works": FORK},
    # Programs stay uid 0, like the trainer (#37: one killed the trainer's whole process group).
    "root_without_setuid": {"setsid_daemon": FORK, "plain_fork_still_works": FORK},
}


def run_helper(tmp_path: Path, condition: str, sandbox: str = "auto", only: list[str] | None = None) -> dict:
    out = tmp_path / f"{condition}-{sandbox}.json"
    # A session of its own: a probe that got through with a process-group kill would hit only it.
    proc = subprocess.run(
        [sys.executable, HELPER, condition, sandbox, str(out), ",".join(only or [])],
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module", params=sorted(SKIPS))
def suite(request, tmp_path_factory):
    return run_helper(tmp_path_factory.mktemp(request.param), request.param)


def result_of(suite: dict, name: str) -> ExecutionResult:
    return ExecutionResult.from_json(suite["results"][name])


@pytest.mark.parametrize("probe", ALL, ids=[f"{p.category}-{p.name}" for p in ALL])
def test_hostile_probe_restricted(suite, probe):
    reason = SKIPS[suite["condition"]].get(probe.name)
    if reason is not None:
        pytest.skip(f"the restricted sandbox gives up {reason}")
    result = result_of(suite, probe.name)
    assert result.status in probe.allowed, (
        f"{probe.name}: {result.status} ({result.error}) not in {sorted(probe.allowed)}"
    )
    no_secret(result)
    if probe.check is not None:
        assert probe.check(result) is not False, result
    assert not os.path.exists(PWNED) and not os.path.exists("/dev/shm/vprl_pwned")
    assert result.duration_s <= TIMEOUT + 1.0  # hang detector only


def test_skips_are_exactly_the_dropped_guarantees(suite):
    """A skipped probe fails here, and for the reason given: fork and listing / are denied."""
    for name in SKIPS[suite["condition"]]:
        result = result_of(suite, name)
        probe = next(p for p in ALL if p.name == name)
        assert result.status not in probe.allowed, f"{name} passes now: take it off the skip list"
        assert result.status == "runtime_error" and result.error.startswith("PermissionError"), result


def test_chosen_automatically_and_announced_in_one_line(suite):
    assert suite["isolation"] == "restricted"
    (line,) = suite["logged"]
    assert "\n" not in line and line.startswith("sandbox: programs run in the restricted sandbox")
    assert "namespaces are unavailable here (netns:" in line
    assert "docs/design-notes.md#the-sandbox-without-namespaces" in line
    assert "gives up a pid namespace" in line
    unprivileged = suite["condition"] in UNPRIVILEGED
    setuid = suite["condition"] == "container_root"
    assert ("an empty root" in line) is unprivileged
    assert ("a uid of their own (they run as the supervisor's uid 0)" in line) is not setuid
    assert ("Landlock ABI" in line) is unprivileged and ("by chroot" in line) is not unprivileged
    assert ("Landlock ABI 5" in line) is (suite["condition"] == "unprivileged_landlock_5")


def test_the_layers_it_found(suite):
    layers = suite["layers"]
    assert layers["netns"] != "ok" and layers["pidns"] != "ok" and layers["seccomp_restricted"] == "ok"
    if suite["condition"] in UNPRIVILEGED:
        assert layers["chroot"] != "ok" and layers["uid"] != "ok" and layers["landlock"] == "ok"
    else:
        assert layers["chroot"] == "ok" and (layers["uid"] == "ok") is (suite["condition"] == "container_root")


def test_no_damage_after_the_suite(suite):
    canary = ExecutionResult.from_json(suite["canary"])
    assert canary.answer == ["denied", "denied", "denied"]  # kill(-1), the supervisor, the runner
    assert suite["supervisor_alive"]
    after = ExecutionResult.from_json(suite["after"])
    assert after.status == "ok" and after.answer == "black"
    assert all(r["status"] != "infra_error" for r in suite["results"].values())
    assert suite["left_behind"] == []  # no process of a program outlived the executor
    assert suite["labels_mode_after"] == suite["mode"]  # chmod and utime were refused
    assert "zebra" in suite["labels_after"]


def test_full_is_still_refused_without_namespaces(tmp_path):
    report = run_helper(tmp_path, "container_root", "full")
    message = report["refused"]
    assert "netns" in message and "pidns" in message and "`sandbox: restricted`" in message
    assert report["logged"] == [] and "results" not in report


def test_auto_refuses_where_neither_landlock_nor_chroot_walls_off_the_files(tmp_path):
    report = run_helper(tmp_path, "unprivileged_no_landlock")
    message = report["refused"]
    assert "the restricted sandbox (no namespaces) cannot start: it lacks" in message
    assert "landlock: OSError: [Errno 38]" in message and "`lsm=`" in message and "run the executor as root" in message
    assert "results" not in report


def test_root_that_cannot_change_uid_keeps_no_capability(tmp_path):
    """chroot works but setuid does not (a runtime that dropped CAP_SETUID): programs stay uid 0, so
    the sandbox empties their capability sets itself."""
    names = ["no_capabilities", "raise_own_limits", "list_root", "kill_the_runner", "memory_bomb"]
    report = run_helper(tmp_path, "root_without_setuid", "auto", names)
    assert report["isolation"] == "restricted" and report["layers"]["uid"] != "ok"
    (line,) = report["logged"]
    assert "by chroot" in line and "a uid of their own (they run as the supervisor's uid 0)" in line
    statuses = {name: (r["status"], r["answer"]) for name, r in report["results"].items()}
    assert statuses == {
        "no_capabilities": ("ok", 0),
        "raise_own_limits": ("runtime_error", None),
        "list_root": ("ok", []),
        "kill_the_runner": ("runtime_error", None),
        "memory_bomb": ("memory_limit", None),
    }


NEIGHBOURS = str(Path(__file__).resolve().parent / "restricted_neighbours.py")


# About 20 s each on 2 cores: the two root kinds (uids of the slots' own, which two executors used
# to share; programs that share the trainer's uid 0) and the two unprivileged ones (with Landlock's
# signal scoping, and on Landlock ABI <= 5, where only the filter stands).
@pytest.mark.parametrize(
    "condition", ["container_root", "root_without_setuid", "unprivileged", "unprivileged_landlock_5"]
)
def test_item_1_a_neighbour_executor_gets_a_clean_runs_results(tmp_path, condition):
    """#37 item 1: two executors on one node (two ranks); programs of one aim every way of
    signalling at the other's runner, supervisor, sandboxes and their groups while its batch runs.
    Before, they killed its programs (and, as root without CAP_SETUID, everything of it)."""
    out = tmp_path / "neighbours.json"
    # A session of its own: a signal that got through to a process group would hit only it.
    proc = subprocess.run(
        [sys.executable, NEIGHBOURS, condition, str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    clean, beside = report["clean"], report["beside"]
    assert clean["exit"] == 0 and clean["supervisor_alive"] and len(clean["results"]) == 24
    assert all(status == "ok" for status, _, _ in clean["results"]), clean["results"]
    assert beside["exit"] == 0 and beside["supervisor_alive"] and report["hostile_alive"]
    assert beside["results"] == clean["results"]
    attacks = beside["attacks"]
    assert sum(found for found, *_ in attacks) > 0, attacks  # the neighbour's sandboxes were aimed at
    assert all(status == "ok" and answer == [] for _, status, answer, _ in attacks), attacks
