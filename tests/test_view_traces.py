"""What the run viewer is given to show, recorded where it happens: the unit-test reward's outcomes in
the rollout rows, the evaluation's traces in predictions.jsonl, and a result the trace cut short,
said to be cut. The executor's side of the program lines is tests/test_executor_results.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vprl.data.records import Example
from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
from vprl.data.shapes.tasks import load_shapes_tasks
from vprl.executor.host import ToolHost
from vprl.executor.results import ExecutionResult, ToolCallRecord, short_result
from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.executor.tools.stack import build_backend
from vprl.rewards.compose import RewardComposer, RewardConfig, RewardSpec
from vprl.train.evaluation.modes import _prediction
from vprl.train.evaluation.pipeline import prediction_row
from vprl.train.rollouts.log import RolloutLog
from vprl.train.rollouts.scorer import ScoredBatch
from vprl.train.view import ViewOptions, build_view
from vprl.train.view.eval_data import _card as eval_card
from vprl.train.view.traces import call_marks, cut_short


def page_data(page: Path) -> dict:
    return json.loads((page.parent / "data.js").read_text().removeprefix("window.VIEW_DATA = ").rstrip(";\n"))


# -- a result cut short ----------------------------------------------------------------------------
def test_a_result_the_trace_cut_is_said_to_be_cut_for_every_tool():
    long_answer = short_result("a very long answer " * 30)  # the executor's cut: MAX_TRACE characters
    first_box_cut = short_result([{"box": [1, 2, 3, 4], "score": 0.5, "label": "x" * 400}])
    calls = [
        {"tool": "vqa", "args": {"question": "q"}, "box": None, "result": long_answer, "line": 2},
        {"tool": "detect", "args": {"noun": "cup"}, "box": None, "result": first_box_cut, "line": 3},
        {"tool": "vqa", "args": {"question": "q"}, "box": None, "result": short_result("ends in dots..."), "line": 4},
        {"tool": "vqa", "args": {"question": "q"}, "box": None, "result": "ToolError: bad..."},
        {"tool": "detect", "args": {"noun": "cup"}, "box": None, "result": short_result([]), "line": 5},
    ]
    marks = call_marks("def execute_command(image):\n    return 1\n", calls, (10, 10))
    assert [m.cut for m in marks] == [True, True, False, False, False]
    assert marks[0].result == long_answer and marks[1].boxes == []  # nothing invented past the cut
    assert cut_short(long_answer) and not cut_short('"whole"') and not cut_short("")


# -- evaluation predictions carry the trace --------------------------------------------------------
def test_evaluation_predictions_carry_the_programs_tool_calls_to_the_viewer():
    example = Example("q1", "shapes", "vqa", "what colour is the cup?", "missing.png", answers=("red",))
    program = "def execute_command(image):\n    p = ImagePatch(image)\n    return p.simple_query('colour?')\n"
    trace = (ToolCallRecord("vqa", {"question": "colour?"}, [0, 0, 8, 8], '"red"', False, 0.01, 3),)
    result = ExecutionResult("q1", "k", "ok", "red", tool_calls=trace)
    key = {"policy": "after_rl", "mode": "single", "dataset": "shapes", "seed": 0}
    row = json.loads(json.dumps(prediction_row(key, example, _prediction(example, program, result), False)))
    assert row["tool_calls"] == [trace[0].to_json()]
    card = eval_card(row, example, None, 0)
    assert "nt" not in card  # "tool calls not recorded" is for rows written before the field
    assert [(m["label"], m["line"], m["inf"]) for m in card["calls"]] == [('simple_query("colour?")', 3, False)]


# -- the label-free reward's outcomes in the rollout rows ------------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    build_dataset(BuildConfig(out=str(root), train=4, val=6, seed=5, winoground=2, sugarcrepe=2, refcoco=2))
    return root


def test_unit_test_outcomes_reach_the_rollout_rows_and_the_page(world, tmp_path):
    examples = load_shapes_tasks(world, ["val"])["val"][:2]
    gold = load_gold_programs(world)["vqa"]
    wrong = 'def execute_command(image):\n    return "purple"\n'
    examples, programs = examples * 2, [gold[e.query] for e in examples] + [wrong] * 2
    spec = RewardSpec("unit_tests", 1.0, {"cache_dir": str(tmp_path / "cache"), "num_tests": 3})
    with SyncRunner(ToolHost(build_backend("shapes")), RunnerConfig(slots=2)) as runner:
        composer = RewardComposer(RewardConfig((spec,)), resources={"runner": runner})
        results = runner.run(list(zip(examples, programs)))
        scored = ScoredBatch(results, composer(examples, results, programs))
    rows = scored.rows(1, examples, programs, "h")
    assert [len(r.unit_tests) for r in rows] == [3, 3, 3, 3]
    for row in rows:
        for test in row.unit_tests:
            assert set(test) == {"caption", "expected", "status", "answer", "score", "image"}
            assert Path(test["image"]).is_file() and test["caption"] and test["expected"]
    passed = [[t["score"] >= 0.5 for t in r.unit_tests] for r in rows]
    assert passed[:2] == [[True] * 3] * 2 and passed[2:] == [[False] * 3] * 2  # gold passes, "purple" fails
    assert all(r.unit_tests == [] for r in scored.rows(1, examples, programs, "h", keep_trace=False))

    run = tmp_path / "run"
    RolloutLog.in_run(run).append(rows)
    # The test images are read where the recipe's reward settings keep them (#37 item 4)
    (run / "config.yaml").write_text(json.dumps({"rewards": [{"name": "unit_tests", "settings": spec.settings}]}))
    data = page_data(build_view(run, ViewOptions(use_examples=False))["page"])
    shown = [c["ut"] for c in data["cards"]]
    assert len(shown) == 4 and all(len(ut) == 3 for ut in shown)
    assert all(t["img"] is not None and data["images"][t["img"]]["src"] for ut in shown for t in ut)
    assert sorted(t["sc"] >= 0.5 for ut in shown for t in ut) == [False] * 6 + [True] * 6
