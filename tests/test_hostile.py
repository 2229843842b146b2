"""Hostile programs, one test per probe: each lands in its allowed statuses and does no damage.

The whole suite runs once per module, concurrently on 2 slots with a 1 s budget, and only after
the canary has shown that isolation is on. Each test then checks its probe's result.
"""

from __future__ import annotations

import os
import time

import pytest
from hostile_probes import MAX_RPCS, PROBES, PWNED, TIMEOUT, no_secret, source_of
from own_processes import sandbox_pids
from test_sandbox import CANARY, SECRET_ENV, make_world

from vprl.executor.runner import RunnerConfig, SyncRunner


def run_suite(runner: SyncRunner, examples, probes=PROBES):
    return dict(zip([p.name for p in probes], runner.run([(examples[0], source_of(p)) for p in probes])))


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    host, examples = make_world(tmp_path_factory.mktemp("hostile"))
    os.environ["VPRL_FAKE_HF_TOKEN"] = SECRET_ENV
    try:
        with SyncRunner(host, RunnerConfig(slots=2, timeout_s=TIMEOUT, max_rpcs=MAX_RPCS)) as runner:
            host.preload()  # as the commands do: a probe's first tool call must not wait on an import
            canary = runner.run([(examples[0], CANARY)])[0]
            # Dangerous probes run only once the canary shows that isolation is on.
            assert canary.status == "ok" and canary.answer["root"] == [] and canary.answer["uid"] >= 60000, canary
            supervisor_pid = runner.runner.supervisor.proc.pid
            t0 = time.monotonic()
            results = run_suite(runner, examples)
            wall = time.monotonic() - t0
            after = runner.run(
                [
                    (
                        examples[0],
                        "def execute_command(image):\n    return ImagePatch(image).find('cat')[0].simple_query('what color is the cat?')\n",
                    )
                ]
            )[0]
            alive = runner.runner.supervisor.alive() and runner.runner.supervisor.proc.pid == supervisor_pid
            print({n: r.duration_s for n, r in results.items() if r.duration_s > TIMEOUT})
            yield {"results": results, "after": after, "supervisor_alive": alive, "wall": wall}
    finally:
        del os.environ["VPRL_FAKE_HF_TOKEN"]


@pytest.mark.parametrize("probe", PROBES, ids=[f"{p.category}-{p.name}" for p in PROBES])
def test_hostile_probe(suite, probe):
    result = suite["results"][probe.name]
    assert result.status in probe.allowed, (
        f"{probe.name}: {result.status} ({result.error}) not in {sorted(probe.allowed)}"
    )
    no_secret(result)
    if probe.check is not None:
        assert probe.check(result) is not False, result
    assert not os.path.exists(PWNED) and not os.path.exists("/dev/shm/vprl_pwned")
    assert result.duration_s <= TIMEOUT + 1.0  # hang detector only; the strict bound is in the soak


def test_no_damage_after_the_suite(suite):
    assert suite["supervisor_alive"]
    assert suite["after"].status == "ok" and suite["after"].answer == "black"
    assert all(r.status != "infra_error" for r in suite["results"].values())
    deadline = time.monotonic() + 2
    while sandbox_pids() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sandbox_pids() == []
