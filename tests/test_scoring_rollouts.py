"""The shared scoring path (executor → rewards → rollout rows) and the rollouts log's crash rules."""

import json

import pytest

from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
from vprl.data.shapes.tasks import load_shapes_tasks
from vprl.executor.host import ToolHost
from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.executor.tools.stack import build_backend
from vprl.rewards.compose import RewardComposer, RewardConfig
from vprl.rewards.registry import build_reward
from vprl.train.rollouts.log import RolloutLog, RolloutRow
from vprl.train.rollouts.scorer import ProgramScorer


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    build_dataset(BuildConfig(out=str(root), train=10, val=12, seed=3))
    return root


def test_scorer_rewards_gold_over_wrong_and_rows_round_trip(world):
    examples = load_shapes_tasks(world, ["val"])["val"][:6]
    gold = load_gold_programs(world)["vqa"]
    programs = [gold[e.query] for e in examples]
    wrong = ["def execute_command(image):\n    return 'no such answer'\n"] * len(examples)
    broken = ["def execute_command(image):\n    return 1/0\n"] * len(examples)
    backend = build_backend({"backend": "oracle", "scene_graphs": str(world / "gqa" / "val_sceneGraphs.json")})
    with SyncRunner(ToolHost(backend), RunnerConfig(slots=2)) as runner:
        scorer = ProgramScorer(runner, RewardComposer(RewardConfig()))
        batch = scorer.score(examples * 3, programs + wrong + broken)
    n = len(examples)
    assert batch.rewards.totals[:n] == [1.0] * n
    assert batch.rewards.totals[n : 2 * n] == [0.0] * n
    assert all(t < 0 for t in batch.rewards.totals[2 * n :])
    rows = batch.rows(4, examples * 3, programs + wrong + broken, prompt_hash="abc", policy="tiny")
    assert [r.status for r in rows[2 * n :]] == ["runtime_error"] * n
    assert rows[0].components == {"correctness": 1.0} and rows[0].tool_calls
    assert all(RolloutRow.from_json(json.loads(json.dumps(r.to_json()))) == r for r in rows)


def test_live_resources_reach_only_factories_that_name_them():
    # correctness takes no resources: handing it a runner must not break it
    fn = build_reward("correctness", resources={"runner": object()})
    assert callable(fn)
    with pytest.raises(ValueError, match="registered rewards"):
        build_reward("no_such_reward", resources={"runner": object()})


def _row(step, i):
    return RolloutRow(step=step, example_id=f"e{i}", prompt_hash="h", program="p", status="ok", total=1.0)


def test_rollout_log_truncates_for_resume_and_drops_a_torn_tail(tmp_path):
    log = RolloutLog.in_run(tmp_path)
    assert log.read() == [] and log.last_step() is None and log.truncate_after(3) == 0
    for step in range(1, 5):
        log.append([_row(step, i) for i in range(3)])
    with open(log.path, "a") as f:
        f.write('{"step": 5, "example_id": "e0", "prompt_h')  # killed mid-write
    with pytest.warns(UserWarning, match="torn last line"):
        assert log.last_step() == 4
    with pytest.warns(UserWarning):
        assert log.truncate_after(2) == 6
    assert [r.step for r in log.read()] == [1, 1, 1, 2, 2, 2]
    assert log.path.read_text().endswith("\n")


def test_rollout_log_names_the_line_of_a_bad_row(tmp_path):
    log = RolloutLog.in_run(tmp_path)
    log.append([_row(1, 0)])
    with open(log.path, "a") as f:
        f.write("not json\n")
    log.append([_row(2, 0)])
    with pytest.raises(ValueError, match=r"rollouts.jsonl:2"):
        log.read()
