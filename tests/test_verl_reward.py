"""vprl's rewards for verl (`vprl.train.integrations.for_verl`, `verl_data`, configs/verl/, issue #26): a
recipe's data in verl's parquet layout, the batch form scoring a step in one call, the per-sample
form (verl 0.9's reward loop) batching concurrent samples into one call, unscorable completions,
bad input named; and, with verl beside the venv, the same through verl's own reward code."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from rl_tiny import build_world, write_recipe
from verl_side import REPO, VERL_CONFIG, run_with_verl

from vprl.data.records import Example
from vprl.rewards.compose import RewardBatch
from vprl.train.integrations import for_verl, verl_data
from vprl.train.integrations.session import ScoringSession, SessionConfig
from vprl.train.rollouts.scorer import ScoredBatch

BROKEN = {"syntax_error": "\n    return (\n", "runtime_error": "\n    return 1/0\n"}


@pytest.fixture(scope="module", autouse=True)
def _close_sessions():
    yield
    for_verl.close()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("verl")
    world = build_world(root / "world")
    model = root / "model"  # verl_data reads the recipe whole; the policy is verl's to load
    model.mkdir()
    (model / "config.json").write_text("{}")
    recipe = write_recipe(
        root / "recipe.yaml",
        model_name_or_path=str(model),
        dataset_root=str(world),
        tool_stack="shapes",
        output_dir=str(root / "run"),
        rewards=[{"name": "correctness", "weight": 1.0}, {"name": "unit_tests", "weight": 0.5}],
    )
    out = verl_data.main(["--config", str(recipe)])
    return world, out


def _rows(out: Path) -> list[dict]:
    from datasets import Dataset

    return Dataset.from_parquet(str(out / "train.parquet")).to_list()


def _responses(world: Path, rows: list[dict]) -> tuple[list[dict], list[str]]:
    """Two right programs per example for two examples, a constant one, and two broken ones."""
    from vprl.data.shapes import load_gold_programs

    gold = load_gold_programs(world)["vqa"]
    body = {i: "\n" + gold[json.loads(rows[i]["extra_info"]["example"])["query"]].split("\n", 1)[1] for i in (0, 1)}
    picked = [rows[0], rows[0], rows[1], rows[1], rows[0], rows[1], rows[0]]
    texts = [
        body[0],
        body[0],
        body[1],
        body[1],
        "\n    return 'yes'\n",
        BROKEN["syntax_error"],
        BROKEN["runtime_error"],
    ]
    return picked, texts


def _call_batch(out: Path, rows: list[dict], texts: list[str], **kwargs):
    """As verl's batch reward manager calls a custom reward: keywords, lists of a whole step."""
    return for_verl.compute_score_batch(
        data_sources=[r["data_source"] for r in rows],
        solution_strs=texts,
        ground_truths=[r["reward_model"]["ground_truth"] for r in rows],
        extra_infos=[r["extra_info"] for r in rows],
        settings=str(out / "vprl_reward.json"),
        **kwargs,
    )


def _counting(monkeypatch, name: str) -> list[int]:
    sizes: list[int] = []
    original = getattr(ScoringSession, name)

    if name == "ascore":

        async def counted(self, examples, programs):
            sizes.append(len(programs))
            return await original(self, examples, programs)
    else:

        def counted(self, examples, programs):
            sizes.append(len(programs))
            return original(self, examples, programs)

    monkeypatch.setattr(ScoringSession, name, counted)
    return sizes


def test_the_recipe_is_written_in_verls_layout(prepared):
    world, out = prepared
    rows = _rows(out)
    assert len(rows) == 16 and set(rows[0]) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    first = rows[0]
    assert first["reward_model"]["style"] == "rule" and first["ability"] == "visual_programming"
    assert first["prompt"][0]["role"] == "user"
    assert first["prompt"][0]["content"].endswith(first["extra_info"]["prompt_tail"])
    assert first["extra_info"]["prompt_tail"] == "def execute_command(image) -> str:"
    example = Example.from_json(json.loads(first["extra_info"]["example"]))
    assert Path(example.image).is_absolute() and Path(example.image).is_file()
    assert first["reward_model"]["ground_truth"] == example.answers[0] and first["data_source"] == example.dataset
    config = SessionConfig.from_json(json.loads((out / "vprl_reward.json").read_text()))
    assert [(s.name, s.weight) for s in config.rewards.rewards] == [("correctness", 1.0), ("unit_tests", 0.5)]
    assert config.run_dir == str(out.parent.resolve()) and config.runner.slots == 2
    assert config.tool_stack["backend"] == "shapes" and Path(config.tool_stack["_source"]).is_absolute()
    assert (out / "overrides.txt").read_text().split() == [
        f"data.train_files={out.resolve() / 'train.parquet'}",
        f"data.val_files={out.resolve() / 'train.parquet'}",
        f"reward.custom_reward_function.reward_kwargs.settings={out.resolve() / 'vprl_reward.json'}",
    ]


def test_the_batch_form_scores_a_whole_step_in_one_call(prepared, monkeypatch):
    world, out = prepared
    rows, texts = _responses(world, _rows(out))
    calls = _counting(monkeypatch, "score")
    scores = _call_batch(out, rows, texts)
    assert calls == [7]
    assert [s["status"] for s in scores] == ["ok"] * 5 + ["syntax_error", "runtime_error"]
    assert [s["score"] for s in scores[5:]] == [-1.0, -0.5] and all(s["scorable"] for s in scores)
    assert all(set(s) == {"score", "status", "scorable", "correctness", "unit_tests"} for s in scores)
    for s in scores[:5]:
        assert s["score"] == pytest.approx(s["correctness"] + 0.5 * s["unit_tests"])
    assert scores[0] == scores[1] and scores[5]["correctness"] is None


def test_the_per_sample_form_runs_concurrent_samples_in_one_call(prepared, monkeypatch):
    world, out = prepared
    rows, texts = _responses(world, _rows(out))
    settings = str(out / "vprl_reward.json")
    expected = _call_batch(out, rows, texts)
    calls = _counting(monkeypatch, "ascore")

    async def step():
        one = [
            for_verl.compute_score(
                data_source=r["data_source"],
                solution_str=t,
                ground_truth=r["reward_model"]["ground_truth"],
                extra_info=r["extra_info"],
                settings=settings,
                batch_wait_s=0.5,
            )
            for r, t in zip(rows, texts, strict=True)
        ]
        together = await asyncio.gather(*one)
        late = await for_verl.compute_score(
            data_source="shapes",
            solution_str=texts[0],
            ground_truth="",
            extra_info=rows[0]["extra_info"],
            settings=settings,
        )
        return together, late

    together, late = asyncio.run(step())
    assert together == expected and late == expected[0]
    assert calls == [7, 1]  # the step's samples in one call; one arriving after the window in another


def test_an_unscorable_completion_gets_no_advantage():
    examples = [Example(id=i, dataset="d", task="vqa", query="q", image="x.png") for i in ("a", "a", "a", "b")]
    batch = RewardBatch(
        totals=[1.0, None, 0.0, None],
        components={"correctness": [1.0, None, 0.0, None]},
        statuses=["ok", "infra_error", "ok", "infra_error"],
    )
    rows = for_verl.results(ScoredBatch([], batch), examples, unscorable_score=-7.0)
    assert [r["score"] for r in rows] == [1.0, 0.5, 0.0, -7.0]
    assert [r["scorable"] for r in rows] == [True, False, True, False]
    group = [r["score"] for r in rows[:3]]
    assert rows[1]["score"] - sum(group) / len(group) == 0.0  # GRPO's advantage of the filled one


def test_bad_input_is_named(prepared, tmp_path):
    world, out = prepared
    row = _rows(out)[0]
    settings = str(out / "vprl_reward.json")
    with pytest.raises(ValueError, match=r"extra_info lacks \['prompt_tail'\].*verl_data"):
        for_verl.compute_score_batch(
            ["shapes"], ["x"], [""], [{"example": row["extra_info"]["example"]}], settings=settings
        )
    with pytest.raises(ValueError, match=r"settings: .*nothing.json does not exist.*verl_data"):
        for_verl.compute_score_batch(
            ["shapes"], ["x"], [""], [row["extra_info"]], settings=str(tmp_path / "nothing.json")
        )
    with pytest.raises(ValueError, match=r"with reward_kwargs: unknown key\(s\) \['tool'\]"):
        for_verl.compute_score_batch(["shapes"], ["x"], [""], [row["extra_info"]], settings=settings, tool="shapes")
    with pytest.raises(ValueError, match=r"rewards\[0\]: unknown reward 'corectness'"):
        for_verl.compute_score_batch(["shapes"], ["x"], [""], [row["extra_info"]], rewards=["corectness"])
    assert for_verl.compute_score_batch([], [], [], [], settings=settings) == []


def test_the_verl_recipe_keeps_the_trl_recipes_settings_and_framing(prepared):
    recipe = yaml.safe_load((VERL_CONFIG / "viunit_grpo.yaml").read_text())
    kwargs = recipe["reward"]["custom_reward_function"]
    assert kwargs["path"] == "pkg://vprl.train.integrations.for_verl" and callable(getattr(for_verl, kwargs["name"]))
    vprl = yaml.safe_load((REPO / "configs" / "grpo_codellama_gqa_unit_tests.yaml").read_text())
    model = recipe["actor_rollout_ref"]["model"]
    assert model["path"] == vprl["model_name_or_path"]
    assert (model["lora_rank"], model["lora_alpha"]) == (vprl["lora_r"], vprl["lora_alpha"])
    assert recipe["actor_rollout_ref"]["rollout"]["n"] == vprl["num_generations"]
    assert recipe["data"]["max_response_length"] == vprl["max_completion_length"]
    # verl renders every prompt through a chat template: this one gives vprl's plain framing's ids
    from vprl.train.policy.tiny import train_tokenizer
    from vprl.train.prompts import encode_prompt

    rows = _rows(prepared[1])
    tokenizer = train_tokenizer([r["prompt"][0]["content"] for r in rows] * 3, vocab_size=400)
    tokenizer.chat_template = model["custom_chat_template"]
    for row in rows[:4]:
        text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids == encode_prompt(row["prompt"][0]["content"], tokenizer)


def test_verls_own_reward_code_gets_vprls_scores(prepared, tmp_path):
    world, out = prepared
    rows, texts = _responses(world, _rows(out))
    from vprl.train.policy.tiny import train_tokenizer

    tokenizer = train_tokenizer([r["prompt"][0]["content"] + t for r, t in zip(rows, texts)] * 3, vocab_size=400)
    tokenizer.save_pretrained(str(tmp_path / "tokenizer"))
    settings = out / "vprl_reward.json"
    overrides = [
        f"data.train_files={out / 'train.parquet'}",
        f"data.val_files={out / 'train.parquet'}",
        f"actor_rollout_ref.model.path={tmp_path / 'tokenizer'}",
        f"reward.custom_reward_function.reward_kwargs.settings={settings}",
    ]
    case = {"config_dir": str(VERL_CONFIG), "overrides": overrides, "tokenizer": str(tmp_path / "tokenizer")}
    case.update(rows=rows, responses=texts)
    done = run_with_verl("verl_managers.py", case, tmp_path)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    expected = _call_batch(out, rows, texts)
    assert [o["score"] for o in got["loop"]] == [e["score"] for e in expected]
    assert [o["extra"] for o in got["loop"]] == expected
    assert got["batch"]["sums"] == pytest.approx([e["score"] for e in expected])
    assert got["batch"]["extra"]["status"] == [e["status"] for e in expected]
