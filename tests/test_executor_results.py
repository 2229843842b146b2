"""`rpc_wait_s`: the time a program waited on the tool host, in results and in the CLI summary; the
program line each tool call was made from, sandboxed and in-process."""

from __future__ import annotations

import contextlib

import pytest
from test_runner import faulty_world
from test_sandbox import make_world

from vprl.executor.api import SourceImage
from vprl.executor.program import line_map, run_in_process, valid_line
from vprl.executor.results import ExecutionResult, ToolCallRecord
from vprl.executor.run import time_summary
from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.executor.tools.local import LocalToolClient

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


# Three calls from three lines, one of them inside a helper (its line is the helper's).
LINED = (
    "def execute_command(image):\n"  # 1
    "    p = ImagePatch(image)\n"  # 2
    "    cats = p.find('cat')\n"  # 3
    "    # the colour of the first cat\n"  # 4
    "    colour = ask(cats[0], 'what color is the cat?')\n"  # 5
    "    return [colour, p.simple_query('is there a dog?')]\n"  # 6
    "\n"  # 7
    "def ask(patch, question):\n"  # 8
    "    return patch.simple_query(question)\n"  # 9
)
LINED_CALLS = [("detect", 3), ("vqa", 9), ("vqa", 6)]


def test_tool_call_line_round_trips_and_old_rows_still_load():
    record = ToolCallRecord("vqa", {"question": "q"}, [0, 0, 4, 4], '"red"', False, 0.5, 7)
    assert ToolCallRecord.from_json(record.to_json()) == record
    old_row = record.to_json()
    del old_row["line"]  # written before the field existed
    assert ToolCallRecord.from_json(old_row).line is None
    with pytest.raises(ValueError, match="line"):
        ToolCallRecord.from_json({**record.to_json(), "line": "7"})


@pytest.mark.parametrize("sandbox", ["full", "none"])
def test_each_tool_call_records_its_program_line(tmp_path, sandbox):
    host, examples = make_world(tmp_path)
    # The same program (one program_key) with a comment line on top: it shares the result of the
    # first, in flight and from the memo, and its trace's lines must be those of its own text.
    moved = "# the policy wrote a comment first\n" + LINED
    warned = pytest.warns(RuntimeWarning) if sandbox == "none" else contextlib.nullcontext()
    with warned, SyncRunner(host, RunnerConfig(slots=1, timeout_s=5.0, sandbox=sandbox)) as runner:
        first, shared = runner.run([(examples[0], LINED), (examples[0], moved)])
        (remembered,) = runner.run([(examples[0], moved)])
    host.close()
    assert first.status == "ok", first
    assert [(c.tool, c.line) for c in first.tool_calls] == LINED_CALLS
    one_down = [(tool, line + 1) for tool, line in LINED_CALLS]
    assert [(c.tool, c.line) for c in shared.tool_calls] == one_down
    assert [(c.tool, c.line) for c in remembered.tool_calls] == one_down


def test_in_process_client_records_the_program_line(tmp_path):
    host, examples = make_world(tmp_path)
    client = LocalToolClient(host.backend)
    image = host.backend.images.add_file(examples[0].image)
    outcome, _, _ = run_in_process(LINED, {"image": SourceImage(image.ref, image.width, image.height)}, client)
    assert outcome.status == "ok", outcome
    assert [(c.tool, c.line) for c in client.trace] == LINED_CALLS


def test_line_map_follows_comments_and_layout():
    written = "# a comment\n" + LINED.replace("    p = ImagePatch(image)\n", "\n    p = ImagePatch(\n        image)\n")
    lines = line_map(LINED, written)
    assert lines[3] == 6 and lines[9] == 12 and lines[6] == 9
    assert line_map(LINED, "def execute_command(image):\n    return 1\n") == {}  # not one program


def test_a_line_the_runner_cannot_trust_is_not_kept():
    # The line crosses from the sandbox: whatever the program wrote there is refused, not stored.
    assert valid_line(3) == 3
    assert [valid_line(v) for v in (0, -1, True, "3", 3.0, 10**9, None, [3])] == [None] * 8
