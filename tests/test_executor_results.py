"""`rpc_wait_s`: the time a program waited on the tool host, in results and in the CLI summary."""

from __future__ import annotations

import contextlib

import pytest
from test_runner import faulty_world

from vprl.executor.results import ExecutionResult, ToolCallRecord
from vprl.executor.run import time_summary
from vprl.executor.runner import RunnerConfig, SyncRunner

THREE_CALLS = (
    "def execute_command(image):\n    p = ImagePatch(image)\n"
    "    return [p.simple_query(q) for q in ('what color is the cat?', 'what is this?', 'is there a dog?')]\n"
)


def test_rpc_wait_round_trips_and_old_rows_still_load():
    result = ExecutionResult("q", "k", "ok", "a", None, 1.5, (ToolCallRecord("vqa", {}, None, "x"),), "", 0.25)
    assert ExecutionResult.from_json(result.to_json()) == result
    old_row = result.to_json()
    del old_row["rpc_wait_s"]  # written before the field existed
    assert ExecutionResult.from_json(old_row).rpc_wait_s == 0.0


@pytest.mark.parametrize("sandbox", ["full", "none"])
def test_time_waiting_on_tools_is_reported(tmp_path, sandbox):
    host, examples = faulty_world(tmp_path, "slow")  # 0.3 s per vqa call
    warned = pytest.warns(RuntimeWarning) if sandbox == "none" else contextlib.nullcontext()
    with warned, SyncRunner(host, RunnerConfig(slots=1, timeout_s=5.0, sandbox=sandbox)) as runner:
        waited, quick = runner.run(
            [(examples[0], THREE_CALLS), (examples[0], "def execute_command(image):\n    return 1\n")]
        )
    assert waited.status == "ok", waited
    assert 0.9 <= waited.rpc_wait_s <= waited.duration_s  # three 0.3 s calls, all inside the program's time
    assert quick.rpc_wait_s == 0.0
    line = time_summary([waited, quick])
    assert line.startswith("time: median") and "waiting on the tool host" in line and "% of program time" in line
    host.close()
