"""Records read from files are checked against their dataclass's types: a wrong type is refused with
the file, line and field, never coerced (`"answers": "yes"` once became `('y', 'e', 's')`, and the
answer "y" scored exact match 1.0)."""

from __future__ import annotations

import json

import pytest

from vprl.data.records import read_examples
from vprl.data.typed import check_row, mismatch
from vprl.executor.results import ExecutionResult
from vprl.executor.tools.stack import build_backend
from vprl.rewards.compose import RewardConfig
from vprl.train.rollouts.log import RolloutLog

EXAMPLE = {"id": "e1", "dataset": "gqa", "task": "vqa", "query": "is it red?", "image": "a.png", "answers": ["yes"]}


def _examples(tmp_path, bad: dict) -> str:
    path = tmp_path / "examples.jsonl"
    path.write_text(json.dumps(EXAMPLE) + "\n" + json.dumps({**EXAMPLE, "id": "e2", **bad}) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"answers": "yes"}, r"answers: expected a list of strings, got str 'yes'"),
        ({"answers": ["yes", 1]}, r"answers: expected a list of strings \(a string inside\)"),
        ({"image": 3}, r"image: expected a string, got int 3"),
        ({"box": [1, 2, 3]}, r"box: expected a list of 4 numbers or null, got list \[1, 2, 3\]"),
        ({"box": "1,2,3,4"}, r"box: expected a list of 4 numbers or null"),
        ({"meta": ["x"]}, r"meta: expected a mapping"),
        ({"query": None}, r"query: expected a string, got NoneType"),
        ({"task": "vqa", "group": 7}, r"group: expected a string"),
    ],
)
def test_examples_with_a_wrong_type_are_refused_with_file_and_line(tmp_path, bad, message):
    path = _examples(tmp_path, bad)
    with pytest.raises(ValueError, match=rf"{path}:2: {message}"):
        read_examples(path)


def test_a_good_examples_file_reads_back_as_written(tmp_path):
    path = _examples(tmp_path, {"box": [1, 2, 3, 4], "meta": {"k": 1}})
    first, second = read_examples(path)
    assert first.answers == ("yes",) and second.box == (1.0, 2.0, 3.0, 4.0) and second.meta == {"k": 1}


def test_results_and_their_tool_calls_are_typed():
    row = {"example_id": "e1", "program_key": "k", "status": "ok", "answer": "yes", "duration_s": 0.1}
    assert ExecutionResult.from_json({**row, "tool_calls": []}).answer == "yes"
    with pytest.raises(ValueError, match=r"results.jsonl:3: duration_s: expected a number, got str"):
        ExecutionResult.from_json({**row, "duration_s": "fast"}, "results.jsonl:3")
    call = {"tool": "vqa", "args": {}, "box": None, "result": "yes", "cached": "no"}
    with pytest.raises(ValueError, match=r"tool_calls\[0\]: cached: expected true or false, got str"):
        ExecutionResult.from_json({**row, "tool_calls": [call]}, "results.jsonl:3")


def test_reward_configs_are_typed():
    assert RewardConfig.from_json({"rewards": [{"name": "correctness", "weight": 2}]}).rewards[0].weight == 2.0
    with pytest.raises(ValueError, match=r"rewards\[0\]: weight: expected a number, got str 'heavy'"):
        RewardConfig.from_json({"rewards": [{"name": "correctness", "weight": "heavy"}]})
    with pytest.raises(ValueError, match=r"rewards\[1\]: settings: expected a mapping"):
        RewardConfig.from_json({"rewards": ["correctness", {"name": "unit_tests", "settings": [5]}]})
    with pytest.raises(ValueError, match=r"penalties: expected a mapping of status to number"):
        RewardConfig.from_json({"penalties": {"syntax_error": "low"}})


def test_tool_stack_settings_are_typed(tmp_path):
    stack = tmp_path / "stack.yaml"
    stack.write_text("backend: shapes\nmin_visible: high\n")
    with pytest.raises(ValueError, match=rf"{stack}: .*min_visible: expected a number, got 'high'"):
        build_backend(stack)
    hf = tmp_path / "hf.yaml"
    hf.write_text("backend: hf\nvqa:\n  model: some/model\n  max_batch_size: many\n")
    with pytest.raises(ValueError, match=r"`vqa`: max_batch_size: expected an integer, got str 'many'"):
        build_backend(hf)


def test_rollout_rows_are_typed_with_file_and_line(tmp_path):
    log = RolloutLog(tmp_path / "rollouts.jsonl")
    good = {"step": 1, "example_id": "e1", "prompt_hash": "h", "program": "p", "status": "ok", "total": 1.0}
    log.path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "step": "one"}) + "\n")
    with pytest.raises(ValueError, match=rf"{log.path}:2: step: expected an integer, got str 'one'"):
        log.read()


def test_the_checker_follows_the_annotations():
    assert mismatch(True, int) == "an integer"  # a bool is not a count
    assert mismatch(3, float) is None and mismatch(None, str | None) is None
    assert mismatch([1.0, 2.0], tuple[float, float]) is None and mismatch([1.0], tuple[float, float]) == "2 values"
    assert mismatch({"a": 1}, dict[str, int]) is None and mismatch("x", list[str]) == "a list of strings"
    with pytest.raises(ValueError, match=r"here: unknown key\(s\) \['colour'\]"):
        check_row(ExecutionResult, {"colour": 1}, "here")
