"""Tool host (batching, cache, failure policy), batch runner (dedup, exactly-once, budgets),
fault injection, the CLI, and the mixed soak run."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import signal
import threading
import time

import pytest
from hostile_probes import PROBES, PWNED, source_of
from own_processes import sandbox_pids
from test_sandbox import NORMAL, make_world, normal_program

from vprl.data.records import write_jsonl
from vprl.executor.host import ToolHost
from vprl.executor.runner import BatchRunner, RunnerConfig, SyncRunner
from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.errors import ToolError, ToolUnavailable
from vprl.executor.tools.oracle import OracleBackend

BUSY = "def execute_command(image):\n    while True:\n        pass\n"


class FaultyOracle(OracleBackend):
    """The oracle with a configurable failure on `vqa`."""

    fault = "none"

    def vqa(self, calls):
        if self.fault == "hang":
            time.sleep(2.0)
        elif self.fault == "slow":
            time.sleep(0.3)
        elif self.fault == "garbage":
            return [object() for _ in calls]
        elif self.fault == "wrong_count":
            return []
        elif self.fault == "crash":
            raise RuntimeError("CUDA error: device-side assert")
        elif self.fault == "unavailable":
            raise ToolUnavailable("model server down")
        return super().vqa(calls)


def faulty_world(tmp_path, fault, **host_kw):
    host, examples = make_world(tmp_path)
    backend = FaultyOracle(host.images, scenes=host.backend.scenes)
    backend.fault = fault
    return ToolHost(backend, **host_kw), examples


VQA = "def execute_command(image):\n    return ImagePatch(image).simple_query('{q}')\n"


# -- tool host ------------------------------------------------------------------------------------
def test_host_batches_caches_and_merges(tmp_path):
    host, examples = make_world(tmp_path)
    host.max_wait_ms = 20
    ref = host.images.add_file(examples[0].image).ref

    async def go():
        calls = [
            ToolCall("detect", ref, None, {"noun": n, "threshold": None}) for n in ("cat", "dog", "car", "animal")
        ]
        first = await asyncio.gather(*(host.call(c) for c in calls))
        again = await asyncio.gather(*(host.call(c) for c in calls))
        same = ToolCall("vqa", ref, None, {"question": "what color is the cat?"})
        merged = await asyncio.gather(*(host.call(same) for _ in range(5)))
        return first, again, merged

    first, again, merged = asyncio.run(go())
    metrics = host.metrics()
    # "animal" names both the cat and the dog (the oracle's broader names, docs/oracle.md)
    assert [len(r) for r, _, _ in first] == [1, 1, 0, 2] and not any(c for _, c, _ in first)
    assert all(cached for _, cached, _ in again) and [r for r, _, _ in again] == [r for r, _, _ in first]
    assert {r for r, _, _ in merged} == {"black"}
    assert metrics["batch_sizes"] == {1: 1, 4: 1}  # 4 detects in one batch, 5 identical vqa as one call
    assert metrics["backend_calls"] == 5 and metrics["cache_hits"] == 4 and metrics["inflight_hits"] == 4
    host.close()


def test_host_rejects_bad_calls_as_program_errors(tmp_path):
    host, examples = make_world(tmp_path)
    ref = host.images.add_file(examples[0].image).ref

    async def go(call):
        return await host.call(call)

    for call in (
        ToolCall("detect", ref, (0, 0, 500, 10), {"noun": "cat"}),  # box outside the image
        ToolCall("detect", "0" * 20, None, {"noun": "cat"}),  # an image the program invented
        ToolCall("vqa", ref, None, {"question": "x" * 5000}),
        ToolCall("detect", ref, None, {"noun": "cat", "threshold": float("nan")}),
        ToolCall("rm -rf", ref, None, {}),
    ):
        with pytest.raises(ToolError):
            asyncio.run(go(call))
    host.close()


@pytest.mark.parametrize("fault", ["hang", "garbage", "wrong_count", "crash", "unavailable"])
def test_tool_host_failures_are_infra_errors(tmp_path, fault):
    host, examples = faulty_world(tmp_path, fault, rpc_timeout_s=0.3)
    swallow = "def execute_command(image):\n    try:\n        return ImagePatch(image).simple_query('what?')\n    except Exception:\n        return 'swallowed'\n"
    with SyncRunner(host, RunnerConfig(slots=2, timeout_s=1.0, rpc_timeout_s=0.3)) as runner:
        results = runner.run([(examples[0], VQA.format(q="what color is the cat?")), (examples[1], swallow)])
        after = runner.run([(examples[0], "def execute_command(image):\n    return 5\n")])
    assert [r.status for r in results] == ["infra_error", "infra_error"], results
    assert after[0].status == "ok"  # the runner survives the tool host's failure
    host.close()


def test_tool_wait_is_not_charged_to_the_program(tmp_path):
    host, examples = faulty_world(tmp_path, "slow")  # 0.3 s per vqa call
    program = "def execute_command(image):\n    p = ImagePatch(image)\n    return [p.simple_query(q) for q in ('what color is the cat?', 'what is this?', 'is there a dog?')]\n"
    with SyncRunner(host, RunnerConfig(slots=1, timeout_s=0.5)) as runner:
        (result,) = runner.run([(examples[0], program)])
    assert result.status == "ok", result  # 0.9 s of tool time against a 0.5 s budget
    assert result.answer == ["black", "dog", "yes"]  # the oracle's 'what' answer is the most visible object
    host.close()


def test_rpc_limit_even_when_swallowed(tmp_path):
    host, examples = make_world(tmp_path)
    program = "def execute_command(image):\n    n = 0\n    for i in range(100):\n        try:\n            ImagePatch(image).exists('cat')\n            n += 1\n        except Exception:\n            pass\n    return n\n"
    with SyncRunner(host, RunnerConfig(slots=1, timeout_s=2.0, max_rpcs=10)) as runner:
        (result,) = runner.run([(examples[0], program)])
    assert result.status == "rpc_limit" and len(result.tool_calls) == 10
    host.close()


# -- runner ---------------------------------------------------------------------------------------
def test_identical_programs_run_once_and_fan_out(tmp_path):
    host, examples = make_world(tmp_path)
    same = [NORMAL[0], NORMAL[0] + "\n# a comment changes nothing\n", NORMAL[0].replace("'", '"')]
    pairs = [(examples[0], same[i % 3]) for i in range(8)] + [(examples[1], NORMAL[0])]
    with SyncRunner(host, RunnerConfig(slots=2, timeout_s=2.0)) as runner:
        results = runner.run(pairs)
    # One run fans out: every copy carries its result (each with the trace lines of its own text,
    # which is why they are not one object), and the tools were called once per example.
    assert len(results) == 9 and len({(r.program_key, r.status, r.answer) for r in results[:8]}) == 1
    assert [[c.line for c in r.tool_calls] for r in results[:3]] == [[c.line for c in results[0].tool_calls]] * 3
    assert results[0].answer == "black" and results[8].answer == "orange"
    assert host.metrics()["calls"] == 4  # detect + vqa, once per example
    host.close()


def test_exactly_one_result_per_submission(tmp_path):
    host, examples = make_world(tmp_path)
    rng = random.Random(0)
    pool = [normal_program(i) for i in range(30)] + [
        source_of(p) for p in PROBES if p.name in ("sys_exit", "os_exit", "generator")
    ]
    pairs = [(rng.choice(examples), rng.choice(pool)) for _ in range(120)]
    with SyncRunner(host, RunnerConfig(slots=2, timeout_s=1.0)) as runner:
        results = runner.run(pairs)
    assert len(results) == len(pairs)
    for (example, _), result in zip(pairs, results):
        assert result.example_id == example.id and result.status != "infra_error"
    host.close()


# -- fault injection ------------------------------------------------------------------------------
def test_sandbox_killed_mid_run(tmp_path):
    host, examples = make_world(tmp_path)
    with SyncRunner(host, RunnerConfig(slots=1, timeout_s=5.0)) as runner:

        def killer():
            # Each slot keeps a spare sandbox warm: killing only that one before the task reaches
            # it just makes the runner start another. Wait until the busy program is running.
            time.sleep(0.5)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                pids = sandbox_pids()
                if pids:
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                    return
                time.sleep(0.01)

        thread = threading.Thread(target=killer)
        thread.start()
        (result,) = runner.run([(examples[0], BUSY)])
        thread.join()
        after = runner.run([(examples[0], NORMAL[0])])
    assert result.status == "killed" and result.duration_s < 4.0
    assert after[0].status == "ok"
    host.close()


def test_shutdown_with_tasks_in_flight(tmp_path):
    host, examples = make_world(tmp_path)

    async def go():
        runner = await BatchRunner(host, RunnerConfig(slots=2, timeout_s=10.0)).start()
        futures = [runner.submit(examples[i % 2], BUSY + f"# {i}\n") for i in range(5)]
        await asyncio.sleep(0.3)
        await runner.close()
        late = runner.submit(examples[0], NORMAL[0])
        return [f.result() for f in futures], await late

    results, late = asyncio.run(go())
    assert [r.status for r in results] == ["infra_error"] * 5
    assert late.status == "infra_error"
    assert _wait_no_sandboxes()
    host.close()


def test_supervisor_death_fails_in_flight_work_as_infra(tmp_path):
    host, examples = make_world(tmp_path)

    async def go():
        runner = await BatchRunner(host, RunnerConfig(slots=2, timeout_s=10.0)).start()
        futures = [runner.submit(examples[0], BUSY + f"# {i}\n") for i in range(3)]
        await asyncio.sleep(0.3)
        os.kill(runner.supervisor.proc.pid, signal.SIGKILL)
        results = await asyncio.wait_for(asyncio.gather(*futures), 5)
        later = await runner.submit(examples[1], NORMAL[1])
        await runner.close()
        return results, later

    results, later = asyncio.run(go())
    assert [r.status for r in results] == ["infra_error"] * 3
    assert later.status == "infra_error"
    assert _wait_no_sandboxes()  # PDEATHSIG took every sandbox down with the supervisor
    host.close()


def _wait_no_sandboxes(seconds: float = 2.0) -> bool:
    deadline = time.monotonic() + seconds
    while sandbox_pids() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not sandbox_pids()


# -- CLI ------------------------------------------------------------------------------------------
def test_cli_end_to_end(tmp_path, capsys):
    from vprl.executor.run import main

    host, examples = make_world(tmp_path)
    graphs = tmp_path / "sceneGraphs.json"
    graphs.write_text(json.dumps(host.backend.scenes))
    write_jsonl(tmp_path / "examples.jsonl", examples)
    rows = [
        {"id": "p1", "example_id": examples[0].id, "program": NORMAL[0]},
        {"id": "p2", "example_id": examples[1].id, "program": NORMAL[0]},
        {"id": "p3", "example_id": examples[0].id, "program": "def execute_command(image):\n    return 1/0\n"},
    ]
    write_jsonl(tmp_path / "programs.jsonl", rows)
    out = tmp_path / "results.jsonl"
    rc = main(
        [
            "--examples", str(tmp_path / "examples.jsonl"),
            "--programs", str(tmp_path / "programs.jsonl"),
            "--tool_stack", "oracle",
            "--tool_overrides", f"{{scene_graphs: {graphs}}}",
            "--out", str(out),
            "--executor_timeout_s", "2",
            "--executor_slots", "2",
        ]
    )  # fmt: skip
    assert rc == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["status"], r["answer"]) for r in got] == [
        ("p1", "ok", "black"),
        ("p2", "ok", "orange"),
        ("p3", "runtime_error", None),
    ]
    assert "statuses: ok=2, runtime_error=1" in capsys.readouterr().out


# -- the mixed soak -------------------------------------------------------------------------------
def _fingerprint(result):
    calls = [(c.tool, json.dumps(c.args, sort_keys=True), c.box, c.result) for c in result.tool_calls]
    return (result.status, json.dumps(result.answer, sort_keys=True), result.error, calls)


def _sandbox_files() -> list[str]:
    found = []
    for folder in ("/tmp", "/dev/shm", os.getcwd()):
        for name in os.listdir(folder):
            try:
                if 60000 <= os.lstat(os.path.join(folder, name)).st_uid < 61000:
                    found.append(os.path.join(folder, name))
            except OSError:
                continue
    return found


def _parent_state():
    return os.getpid(), len(os.listdir("/proc/self/fd")), threading.active_count()


def mixed_soak(tmp_path, n_normal: int, hostile_reps: int, timeout: float, slack: float):
    host, examples = make_world(tmp_path)
    normal = [(examples[i % 2], normal_program(i)) for i in range(n_normal)]
    config = RunnerConfig(slots=2, timeout_s=timeout, max_rpcs=30)
    # The clean results, one per kind of normal program: program i is NORMAL[i % 6] on examples[i % 2]
    # with a comment and an assignment of its own after it, so it must give what program i % 6 gives
    # alone (the mixed run below still runs all n_normal, each compared with its kind's clean result).
    kinds = math.lcm(len(NORMAL), 2)
    with SyncRunner(host, config) as clean_runner:
        reference = clean_runner.run(normal[:kinds])
    clean = [reference[i % kinds] for i in range(n_normal)]
    hostile = [(examples[0], source_of(p)) for p in PROBES for _ in range(hostile_reps)]
    tagged = [("n", i, pair) for i, pair in enumerate(normal)] + [("h", i, pair) for i, pair in enumerate(hostile)]
    random.Random(7).shuffle(tagged)
    with SyncRunner(host, config) as runner:
        runner.run(normal[:4])  # warm-up: the runner's threads and descriptors exist from here on
        before = _parent_state()
        t0 = time.monotonic()
        # Hostile repetitions are distinct submissions: a comment makes each program its own key.
        pairs = [(ex, src + f"\n# {kind}{i}\n") for kind, i, (ex, src) in tagged]
        results = runner.run(pairs)
        wall = time.monotonic() - t0
        after = _parent_state()
    assert len(results) == len(pairs)  # 0 lost (and the sync API returns exactly one per submission)
    assert all(r.example_id == ex.id for (ex, _), r in zip(pairs, results))
    mixed_normal = {i: r for (kind, i, _), r in zip(tagged, results) if kind == "n"}
    assert len(mixed_normal) == n_normal
    diffs = [i for i in range(n_normal) if _fingerprint(mixed_normal[i]) != _fingerprint(clean[i])]
    assert diffs == [], f"{len(diffs)} normal results differ from the clean run"
    statuses = {}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    assert "infra_error" not in statuses, statuses
    over = max(r.duration_s - sum(c.seconds for c in r.tool_calls) for r in results)
    assert over <= timeout + slack, f"a task ran {over:.3f} s against a {timeout} s budget"
    assert before == after, (before, after)  # same pid, descriptors and threads
    assert _wait_no_sandboxes(1.0)
    assert _sandbox_files() == [] and not os.path.exists(PWNED)
    host.close()
    return {
        "programs": len(pairs),
        "wall_s": round(wall, 1),
        "per_min": round(60 * len(pairs) / wall),
        "max_task_s": over,
        "statuses": statuses,
    }


def test_mixed_soak_small(tmp_path):
    figures = mixed_soak(tmp_path, n_normal=200, hostile_reps=1, timeout=1.0, slack=1.0)
    print(figures)


def test_mixed_soak_full(tmp_path):
    figures = mixed_soak(tmp_path, n_normal=2000, hostile_reps=5, timeout=1.0, slack=0.25)
    print(figures)


def test_leak_checks_count_only_this_runs_sandboxes():
    """A training job beside `make test` runs sandboxes under the same uids; the leak checks must not
    count them (they did: a test failed while a run was going on)."""
    import subprocess
    import sys

    from own_processes import SANDBOX_UID_BASE, adopt_orphans

    uid = SANDBOX_UID_BASE + 7
    other_job = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        f"    os.setresgid({uid}, {uid}, {uid}); os.setresuid({uid}, {uid}, {uid})\n"
        "    print(os.getpid(), flush=True); os.close(1); os.close(2); time.sleep(60)\n"
        "else:\n"
        "    os._exit(0)\n"  # the sleeper is orphaned, as another job's sandbox is not ours
    )
    adopt_orphans(False)
    try:
        out = subprocess.run([sys.executable, "-c", other_job], capture_output=True, text=True, check=True)
    finally:
        adopt_orphans(True)
    foreign = int(out.stdout.split()[0])
    try:
        deadline = time.monotonic() + 5
        while foreign not in sandbox_pids(ours_only=False) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert foreign in sandbox_pids(ours_only=False)
        assert foreign not in sandbox_pids()
    finally:
        os.kill(foreign, signal.SIGKILL)
