"""The RL entry point's config, validation, run folder and reward adapter, without training."""

import asyncio
from pathlib import Path

import pytest
import torch
import yaml

from vprl.data.records import Example
from vprl.executor.results import ExecutionResult
from vprl.executor.tools.stack import stack_path
from vprl.rewards.compose import RewardBatch
from vprl.rewards.trl_adapter import TrlRewardAdapter
from vprl.train.online.trainers import stop_length, zero_variance_rows
from vprl.train.recipe.parsing import ConfigError
from vprl.train.recipe.rl_config import ALGORITHMS, parse_rl_config
from vprl.train.runs import folder as runs

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted(p for p in (REPO / "configs").glob("*.yaml") if not p.name.startswith("quickstart"))
QUICKSTARTS = sorted((REPO / "configs").glob("quickstart*.yaml"))


def test_there_are_paper_recipes():
    names = {p.stem for p in RECIPES}
    for alg in ("grpo", "rest"):
        for model in ("codellama", "codegemma"):
            for reward in ("correctness", "unit_tests"):
                assert f"{alg}_{model}_gqa_{reward}" in names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_parses(recipe):
    cfg = parse_rl_config(["--config", str(recipe)])
    assert cfg.algorithm in ALGORITHMS
    assert cfg.policy.lora_r == 16 and cfg.policy.lora_alpha == 32 and cfg.policy.lora_dropout == 0.05
    assert cfg.training.learning_rate == 2e-4 and cfg.training.max_grad_norm == 0.3
    assert stack_path(cfg.executor.tool_stack).is_file()  # a named stack, shipped in the package
    assert cfg.rewards.rewards and all(isinstance(r, dict) for r in cfg.rewards.rewards)
    if cfg.algorithm == "grpo":
        assert (cfg.training.temperature, cfg.training.top_p, cfg.training.max_completion_length) == (1.0, 0.9, 320)
        assert cfg.training.use_vllm


@pytest.mark.parametrize("recipe", QUICKSTARTS, ids=lambda p: p.stem)
def test_the_quickstart_recipes_parse_for_a_cpu(recipe):
    cfg = parse_rl_config(["--config", str(recipe)])
    assert cfg.algorithm == "grpo" and cfg.training.use_cpu and not cfg.training.bf16
    assert cfg.prompt.prompt_layout == "bare" and stack_path(cfg.executor.tool_stack).is_file()
    assert len(QUICKSTARTS) == 2


@pytest.mark.parametrize("name", ["single_gpu", "ddp", "deepspeed_zero2", "deepspeed_zero3", "fsdp"])
def test_accelerate_configs_load(name):
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(REPO / "configs" / "accelerate" / f"{name}.yaml"))
    assert cfg.num_machines == 1


def _recipe(tmp_path, **values):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": "m", "output_dir": str(tmp_path / "run"), **values}))
    return path


def test_defaults_are_the_viunit_recipe(tmp_path):
    cfg = parse_rl_config(["--config", str(_recipe(tmp_path))])
    t = cfg.training
    assert (t.learning_rate, str(t.lr_scheduler_type.value), t.warmup_steps, t.max_grad_norm) == (
        2e-4,
        "linear",
        0.1,
        0.3,
    )
    assert (t.temperature, t.top_p, t.max_completion_length) == (1.0, 0.9, 320)
    assert cfg.policy.lora_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert cfg.rewards.rewards == ["correctness"]


def test_cli_overrides_and_structured_values(tmp_path):
    argv = ["--config", str(_recipe(tmp_path)), "--rewards", '[{"name": "correctness", "weight": 2}]']
    argv += ["--reward_penalties", "{syntax_error: -2}", "--learning_rate", "1e-3", "--dataset_tasks", "train", "val"]
    cfg = parse_rl_config(argv)
    assert cfg.rewards.rewards == [{"name": "correctness", "weight": 2}]
    assert cfg.rewards.reward_penalties == {"syntax_error": -2}
    assert cfg.training.learning_rate == 1e-3 and cfg.data.dataset_tasks == ["train", "val"]
    with pytest.raises(ConfigError, match="reward_penalties: expected a dict"):
        parse_rl_config(["--config", str(_recipe(tmp_path)), "--reward_penalties", "[1, 2]"])


def test_unknown_keys_list_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"'lora_rank': did you mean .*lora_r[\s\S]*valid keys:"):
        parse_rl_config(["--config", str(_recipe(tmp_path, lora_rank=8))])
    # a GRPO-only key is unknown to an RLOO recipe
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['scale_rewards'\]"):
        parse_rl_config(["--config", str(_recipe(tmp_path, algorithm="rloo", scale_rewards="group"))])
    with pytest.raises(ConfigError, match="algorithm: 'ppo' is not one of grpo, rloo, rest"):
        parse_rl_config(["--config", str(_recipe(tmp_path)), "--algorithm", "ppo"])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_resolved_config_reads_back(tmp_path, algorithm):
    cfg = parse_rl_config(["--config", str(_recipe(tmp_path, algorithm=algorithm))])
    flat = cfg.to_flat()
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(flat))
    assert parse_rl_config(["--config", str(again)]).to_flat() == flat


# --- validation: bad input fails before any work, naming what is wrong -------------------------------


@pytest.fixture
def fake_model(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    world = tmp_path / "world"
    world.mkdir()
    return model, world


def _fails(tmp_path, match, **values):
    from vprl.train.rl import main

    with pytest.raises(ConfigError, match=match):
        main(["--config", str(_recipe(tmp_path, **values))])
    assert not (tmp_path / "run").exists(), "nothing may be written before validation passes"


def test_missing_model_path(tmp_path):
    _fails(tmp_path, r"model_name_or_path: .*/nope does not exist", model_name_or_path=str(tmp_path / "nope"))


def test_unknown_dataset(tmp_path, fake_model):
    model, world = fake_model
    _fails(tmp_path, r"unknown dataset 'gqa2'; valid: shapes, gqa", model_name_or_path=str(model), dataset="gqa2")
    _fails(
        tmp_path, r"dataset_root: .*/nowhere does not exist", model_name_or_path=str(model), dataset_root="/nowhere"
    )


def test_missing_tool_stack(tmp_path, fake_model, shapes_world):
    model, _ = fake_model
    _fails(
        tmp_path,
        r"tool_stack: tool stack .*/nope.yaml does not exist",
        model_name_or_path=str(model),
        dataset_root=str(shapes_world),
        tool_stack=str(tmp_path / "nope.yaml"),
    )


def test_unknown_reward(tmp_path, fake_model, shapes_world):
    model, _ = fake_model
    _fails(
        tmp_path,
        r"rewards: unknown reward 'corectness'; registered rewards: \[.*'correctness'",
        model_name_or_path=str(model),
        dataset_root=str(shapes_world),
        tool_stack="shapes",
        rewards=["corectness"],
    )


def test_vllm_missing_is_named(tmp_path, fake_model, shapes_world):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    model, _ = fake_model
    _fails(
        tmp_path,
        r"use_vllm: vLLM is not installed",
        model_name_or_path=str(model),
        dataset_root=str(shapes_world),
        tool_stack="shapes",
        use_vllm=True,
    )


@pytest.fixture(scope="module")
def shapes_world(tmp_path_factory):
    from rl_tiny import build_world

    return build_world(tmp_path_factory.mktemp("world"))


# --- the run folder ------------------------------------------------------------------------------


def test_resume_needs_the_same_recipe(tmp_path):
    runs.write_config(tmp_path, {"learning_rate": 1e-3, "max_steps": 4})
    runs.write_manifest(tmp_path, {"algorithm": "grpo"})
    assert runs.check_resumable(tmp_path, {"learning_rate": 1e-3, "max_steps": 9}, resume=True)
    with pytest.raises(runs.RunFolderError, match=r"learning_rate: 0.001 -> 0.1"):
        runs.check_resumable(tmp_path, {"learning_rate": 0.1, "max_steps": 4}, resume=True)
    with pytest.raises(runs.RunFolderError, match="already holds a run"):
        runs.check_resumable(tmp_path, {"learning_rate": 1e-3}, resume=False)
    assert not runs.check_resumable(tmp_path / "fresh", {}, resume=False)


def test_a_run_from_before_a_key_existed_resumes_with_its_default(tmp_path):
    runs.write_config(tmp_path, {"learning_rate": 1e-3})  # written before `new_key` was added
    runs.write_manifest(tmp_path, {"algorithm": "grpo"})
    config = {"learning_rate": 1e-3, "new_key": 0.0}
    assert runs.check_resumable(tmp_path, config, resume=True, defaults={"new_key": 0.0})
    with pytest.raises(runs.RunFolderError, match=r"new_key: None -> 0.5"):  # set away from its default: a change
        runs.check_resumable(tmp_path, {**config, "new_key": 0.5}, resume=True, defaults={"new_key": 0.0})
    with pytest.raises(runs.RunFolderError, match=r"new_key: None -> 0.0"):  # no default known: a change
        runs.check_resumable(tmp_path, config, resume=True)


def test_the_recipe_knows_each_keys_default():
    from vprl.train.recipe.rl_config import parse_rl_config

    cfg = parse_rl_config(["--algorithm", "grpo", "--model_name_or_path", "m", "--output_dir", "o"])
    defaults, flat = cfg.flat_defaults(), cfg.to_flat()
    assert defaults["repair_guide_weight"] == 0.0 and defaults["repair_kl_turns"] == "all"
    assert defaults["repair_replay_weight"] == 0.0 and defaults["repair_replay_pairs"] is None
    assert defaults["beta"] == 0.0  # the recipes' own default over trl's
    unset = [k for k in ("repair_max_turns", "repair_branches", "num_generations") if flat[k] != defaults[k]]
    assert not unset


def test_checkpoints_ignore_unfinished_saves(tmp_path):
    for n in (2, 10, 4):
        (tmp_path / f"checkpoint-{n}").mkdir()
        (tmp_path / f"checkpoint-{n}" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-12").mkdir()  # killed mid-save
    assert runs.last_checkpoint(tmp_path) == (10, tmp_path / "checkpoint-10")


def test_metrics_log_truncates_for_resume(tmp_path):
    log = runs.MetricsLog(tmp_path)
    for step in (1, 2, 3, 3):
        log.append({"step": step, "loss": 0.5})
    with open(log.path, "a") as f:
        f.write('{"step": 4, "lo')
    with pytest.warns(UserWarning, match=r"metrics\.jsonl:5: dropping a torn last line"):
        assert log.truncate_after(2) == 2
    assert [r["step"] for r in log.read()] == [1, 2]
    with open(log.path, "a") as f:
        f.write('{"step": 3, "lo\n{"step": 4}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:3: not valid JSON"):
        log.read()


# --- the trl reward adapter and the trainer helpers ---------------------------------------------------


class _Scored:
    def __init__(self, results, rewards):
        self.results, self.rewards = results, rewards


class _CountingScorer:
    """Scores `program == 'good'` 1, anything else 0; 'infra' is our failure (masked)."""

    def __init__(self):
        self.calls = 0

    async def ascore(self, examples, programs):
        self.calls += 1
        await asyncio.sleep(0)
        status = ["infra_error" if p == "infra" else "ok" for p in programs]
        results = [ExecutionResult(e.id, p, s, answer=p) for e, p, s in zip(examples, programs, status)]
        comp = [None if s != "ok" else float(p == "good") for p, s in zip(programs, status)]
        totals = [None if s != "ok" else 2 * c for s, c in zip(status, comp)]
        return _Scored(results, RewardBatch(totals, {"correctness": comp}, status))

    def metrics(self):
        return {"cache_hit_rate": 0.25}


def test_adapter_scores_each_batch_once_and_masks_infra_errors():
    scorer = _CountingScorer()
    ex = Example(id="e1", dataset="gqa", task="vqa", query="q?", image="x.png", answers=("a",))
    batches, metrics = [], {}
    adapter = TrlRewardAdapter(
        scorer, {"e1": ex}, lambda prompt, c: c.strip(), ["correctness"], on_batch=batches.append
    )
    completions = ["good", "bad", "infra"]
    kwargs = {"example_id": ["e1"] * 3, "log_metric": metrics.__setitem__}

    async def all_funcs():
        return await asyncio.gather(
            *[f(prompts=["p"] * 3, completions=completions, **kwargs) for f in adapter.reward_funcs]
        )

    total, correctness = asyncio.run(all_funcs())
    assert scorer.calls == 1  # one executor run shared by every reward function
    assert total == [2.0, 0.0, None] and correctness == [1.0, 0.0, None]
    assert adapter.reward_weights == [1.0, 0.0]
    assert [f.__name__ for f in adapter.reward_funcs] == ["total", "correctness"]
    assert metrics["exec/infra_error"] == pytest.approx(1 / 3) and metrics["tools/cache_hit_rate"] == 0.25
    assert len(batches) == 1 and batches[0].programs == completions
    with pytest.raises(ValueError, match="may not be called 'total'"):
        TrlRewardAdapter(scorer, {}, str, ["total"])


def test_zero_variance_groups_use_scorable_totals():
    nan = float("nan")
    # rows: (total, component); groups of 3
    rewards = torch.tensor(
        [[1.0, 1.0], [1.0, 0.0], [1.0, nan], [0.0, 0.0], [1.0, 1.0], [nan, nan], [nan, nan], [nan, nan], [0.5, 1]]
    )
    got = zero_variance_rows(rewards, torch.tensor([1.0, 0.0]), 3)
    assert got.tolist() == [True, False, True]


def test_stop_length_cuts_after_the_stop_token():
    from vprl.train.policy.tiny import train_tokenizer

    tok = train_tokenizer(["def execute_command(image):\n    return 'a'\n\n# next query\n"] * 20, vocab_size=500)
    body = "\n    return 'a'\n\n# next query\ndef x():"
    ids = tok(body, add_special_tokens=False)["input_ids"]
    k = stop_length(ids, tok, ["\n#", "\ndef "])
    kept = tok.decode(ids[:k])
    assert "\n#" in kept and "next query" not in kept and "\n#" not in tok.decode(ids[: k - 1])
    assert stop_length(ids[:3], tok, ["\n#"]) == 3
