import pytest

from vprl.data.records import Example
from vprl.executor.results import ExecutionResult
from vprl.rewards.compose import DEFAULT_PENALTIES, RewardComposer, RewardConfig, RewardSpec
from vprl.rewards.diagnostics import diagnostics, is_trivial
from vprl.rewards.groups import is_zero_variance, zero_variance_groups
from vprl.rewards.registry import build_reward, reward_names


def _ex(i, answer="red"):
    return Example(id=f"q{i}", dataset="gqa", task="vqa", query="what colour?", image="x.png", answers=(answer,))


def _res(i, status="ok", answer="red"):
    return ExecutionResult(
        example_id=f"q{i}", program_key="k", status=status, answer=answer if status == "ok" else None
    )


def test_totals_penalties_and_masking():
    composer = RewardComposer(RewardConfig((RewardSpec("correctness", 2.0), RewardSpec("executes", 0.5))))
    examples = [_ex(0), _ex(1), _ex(2), _ex(3)]
    results = [_res(0), _res(1, answer="blue"), _res(2, "syntax_error"), _res(3, "infra_error")]
    batch = composer(examples, results, ["p"] * 4)
    assert batch.totals == [2.5, 0.5, DEFAULT_PENALTIES["syntax_error"], None]
    assert batch.components["correctness"] == [1.0, 0.0, None, None]
    assert batch.masked() == [False, False, False, True]
    assert batch.statuses[3] == "infra_error"


def test_a_program_no_component_judged_is_masked_not_scored_zero():
    composer = RewardComposer(RewardConfig((RewardSpec("correctness"),)))
    composer.functions = [(RewardSpec("silent"), lambda examples, results, programs: [None] * len(results))]
    batch = composer([_ex(0), _ex(1)], [_res(0), _res(1, "runtime_error")], ["p", "p"])
    assert batch.totals == [None, DEFAULT_PENALTIES["runtime_error"]]
    assert batch.masked() == [True, False]


def test_unknown_reward_fails_at_config_time_with_the_valid_names():
    with pytest.raises(ValueError, match="registered rewards: .*correctness"):
        RewardComposer(RewardConfig((RewardSpec("corectness"),)))
    assert "correctness" in reward_names()


def test_config_round_trip_and_bad_keys():
    cfg = RewardConfig.from_json(
        {"rewards": [{"name": "correctness", "weight": 1.5}, "executes"], "penalties": {"timeout": -2}}
    )
    again = RewardConfig.from_json(cfg.to_json())
    assert again == cfg and again.penalties["timeout"] == -2.0
    with pytest.raises(ValueError, match="unknown key"):
        RewardSpec.from_json({"name": "correctness", "wieght": 1})
    with pytest.raises(ValueError, match="infra_error is always masked"):
        RewardConfig(penalties={"infra_error": 0.0})


def test_grounding_threshold_setting():
    fn = build_reward("correctness", iou_threshold=0.5)
    ex = Example(id="g", dataset="refcoco", task="grounding", query="the cat", image="x.png", box=(0, 0, 10, 10))
    res = [
        ExecutionResult("g", "k", "ok", {"box": [0, 0, 10, 6]}),
        ExecutionResult("g", "k", "ok", {"box": [0, 0, 10, 4]}),
    ]
    assert fn([ex, ex], res, ["p", "p"]) == [1.0, 0.0]


def test_trivial_program_detection():
    trivial = "def execute_command(image):\n    return ImagePatch(image).simple_query('What colour is the car?')\n"
    composed = (
        "def execute_command(image):\n    p = ImagePatch(image)\n    cars = p.find('car')\n"
        "    return cars[0].simple_query('What colour?')\n"
    )
    assert is_trivial(trivial) and not is_trivial(composed) and not is_trivial("def (")


def test_diagnostics_shares():
    d = diagnostics(["a", "b", "c", "d"], ["red", "red", "red", "blue"])
    assert d["constant_answer_share"] == 0.75
    assert d["trivial_share"] == 0.0


def test_zero_variance_groups():
    # equal totals; one scorable total (masked and NaN rows do not count); a real spread
    totals = [1.0, 1.0 + 1e-12, 0.0, None, 0.5, float("nan"), 0.0, 1.0]
    assert zero_variance_groups(totals, 2) == [True, True, True, False]
    assert is_zero_variance([None, None]) and not is_zero_variance([0.0, 0.25, None])
    with pytest.raises(ValueError, match="groups of 3"):
        zero_variance_groups(totals, 3)
