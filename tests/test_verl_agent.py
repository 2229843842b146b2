"""Repair episodes on verl (#35 item 2): `vprl.train.integrations.verl_agent`'s agent loop, as verl's
own `AgentLoopWorker` instantiates and runs it (tests/verl_agent_driver.py, verl beside the venv),
with an LLM server that draws from the policy. What verl's trainer receives: every episode's turns
in one response, the feedback out of `response_mask`, the final program's reward on the last token,
log-probabilities a policy forward over verl's padded batch reproduces (ratio 1), and a PPO loss
whose gradient at every feedback position is exactly zero. No gold answer reaches a feedback block."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from rl_tiny import write_recipe
from verl_side import VERL_CONFIG, run_with_verl, spread_total

from vprl.train.integrations import verl_data
from vprl.train.prompts import STOP_SEQUENCES
from vprl.train.prompts.conversation import episode_tokens
from vprl.train.prompts.framing import HEADER

SENTINEL = "zebra-sentinel-4417"
ROWS, SAMPLES, TURN_TOKENS, RESPONSE = 4, 4, 48, 700


@pytest.fixture(scope="module")
def prepared(repair_assets, tmp_path_factory):
    world, policy = repair_assets
    root = tmp_path_factory.mktemp("verl_agent")
    recipe = write_recipe(
        root / "recipe.yaml",
        model_name_or_path=str(policy),
        dataset_root=str(world),
        tool_stack="shapes",
        output_dir=str(root / "run"),
        max_completion_length=TURN_TOKENS,
        rewards=[{"name": "correctness", "weight": 1.0}],
        # a threshold no correctness reaches: every first program gets feedback
        repair_max_turns=2,
        repair_stop_when="passed",
        repair_check="correctness",
        repair_pass_threshold=2.0,
    )
    return root, verl_data.main(["--config", str(recipe)])


@pytest.fixture(scope="module")
def played(repair_assets, prepared):
    """The driver's samples: ROWS questions x SAMPLES episodes, each program's total spread."""
    root, out = prepared
    from datasets import Dataset

    rows = Dataset.from_parquet(str(out / "train.parquet")).to_list()[:ROWS]
    for row in rows:  # every reference answer is the sentinel: it must not reach the policy
        example = json.loads(row["extra_info"]["example"])
        example["answers"] = [SENTINEL]
        row["extra_info"]["example"] = json.dumps(example)
    overrides = [o for o in (out / "overrides.txt").read_text().split() if not o.startswith("data.max_response")]
    overrides += [
        f"actor_rollout_ref.model.path={repair_assets[1]}",
        "actor_rollout_ref.rollout.prompt_length=1024",
        f"actor_rollout_ref.rollout.response_length={RESPONSE}",
        "data.max_prompt_length=1024",
        f"data.max_response_length={RESPONSE}",
        "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
    ]
    case = {"config_dir": str(VERL_CONFIG), "overrides": overrides, "rows": rows, "n": SAMPLES, "seed": 0}
    case.update(spread=True, out=str(root / "played.json"))
    run_with_verl("verl_agent_driver.py", case, root)
    return json.loads((root / "played.json").read_text(encoding="utf-8"))


def _segments(mask: list[int]) -> list[int]:
    return [m for i, m in enumerate(mask) if i == 0 or mask[i - 1] != m]


def test_verl_data_names_the_agent_loop_with_the_recipes_repair_settings(prepared):
    _, out = prepared
    (entry,) = yaml.safe_load((out / "agent_loops.yaml").read_text())
    assert entry["_target_"] == "vprl.train.integrations.verl_agent.RepairAgentLoop"
    assert (entry["max_turns"], entry["stop_when"], entry["check"], entry["pass_threshold"]) == (
        2, "passed", "correctness", 2.0,
    )  # fmt: skip
    assert entry["turn_tokens"] == TURN_TOKENS and entry["show"] == ["error", "trace", "unit_tests"]
    overrides = (out / "overrides.txt").read_text().split()
    assert (
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={(out / 'agent_loops.yaml').resolve()}" in overrides
    )
    assert "actor_rollout_ref.rollout.agent.default_agent_loop=vprl_repair" in overrides
    # the whole episode fits verl's response: two programs and a feedback block between them
    assert f"data.max_response_length={episode_tokens(2, TURN_TOKENS)}" in overrides


PAIRS = "<a pairs file>"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"repair_branches": 2}, "repair_branches: verl's agent loop plays each episode on its own"),
        ({"repair_kl_turns": "later", "beta": 0.1}, "repair_kl_turns: verl's actor puts its KL on every response"),
        ({"repair_guide_weight": 0.5}, "repair_guide_weight: verl's actor has no guide term"),
        ({"repair_first_credit": "own"}, "repair_first_credit: verl's actor gives a response one advantage"),
        ({"repair_later_credit": "fresh"}, "repair_later_credit: verl's actor gives a response one advantage"),
        ({"repair_first_weight": 0.5}, "repair_first_weight: verl's actor gives a response one advantage"),
        (
            {"repair_replay_weight": 0.5, "repair_replay_pairs": PAIRS},
            "repair_replay_weight: verl's actor has no replay",
        ),
    ],
)
def test_verl_data_refuses_what_its_loop_cannot_do_before_writing_anything(prepared, values, message):
    from vprl.train.recipe.parsing import ConfigError

    root, _ = prepared
    recipe = yaml.safe_load((root / "recipe.yaml").read_text())
    if values.get("repair_replay_pairs") == PAIRS:  # a pairs file that exists: the recipe's check passes
        (root / "pairs.jsonl").write_text("")
        values = {**values, "repair_replay_pairs": str(root / "pairs.jsonl")}
    recipe.update(values, output_dir=str(root / "refused"))
    path = write_recipe(root / "refused.yaml", **recipe)
    with pytest.raises(ConfigError, match=message):
        verl_data.main(["--config", str(path)])
    assert not (root / "refused").exists()


def test_every_episode_is_one_response_with_the_feedback_out_of_the_mask(played):
    samples = played["samples"]
    assert len(samples) == ROWS * SAMPLES
    for s in samples:
        turns = s["episode"]["turns"]
        assert s["turns"] == len(turns) == 2 and s["num_turns"] == 4
        assert _segments(s["mask"]) == [1, 0, 1]
        assert s["feedback"].lstrip("\n").startswith(HEADER)
        assert turns[0]["feedback"]["text"].splitlines()[0] in s["feedback"]
        assert turns[1]["feedback"] is None
    # each turn asked for at most a program's tokens, stopping where a program ends; the second turn
    # continued from the prompt, the first program and the block: exactly what verl's actor holds
    assert all(c["max_tokens"] == TURN_TOKENS and c["stop"] == list(STOP_SEQUENCES) for c in played["calls"])


def test_the_reward_is_the_final_programs_on_the_last_token(played):
    for s in played["samples"]:
        final = s["episode"]["turns"][-1]
        assert s["score_sum"] == pytest.approx(spread_total(final["program"]))
        assert s["score_at"] == len(s["mask"]) - 1


def test_feedback_tokens_get_no_gradient_and_program_tokens_the_episode_advantage(played):
    for s in played["samples"]:
        assert len(s["advantages"]) == 1  # one advantage over both turns' program tokens
        assert s["feedback_grad"] == 0.0
        if s["advantages"][0] != 0:
            assert s["program_grad"] > 0
    assert sum(s["advantages"][0] != 0 for s in played["samples"]) >= ROWS


def test_importance_ratios_are_one_with_a_server_that_draws_from_the_policy(played):
    gaps = [s["max_logp_gap"] for s in played["samples"]]
    assert max(gaps) < 1e-4, gaps
    assert math.exp(max(gaps)) == pytest.approx(1.0, abs=1e-4)


def test_no_gold_answer_reaches_a_feedback_block(played):
    for s in played["samples"]:
        assert SENTINEL not in s["feedback"] and SENTINEL not in s["prompt"]
        assert all(SENTINEL not in json.dumps(t["feedback"]) for t in s["episode"]["turns"])
