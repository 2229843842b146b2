"""Faults a careful reading found on the path users run on GPUs (a 7B policy, the papers' tool stacks),
each reproduced at reduced size on a CPU: every test here failed before its fix."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from rl_tiny import FakeVLLMGeneration, build_policy, build_world, write_recipe

REPO = Path(__file__).resolve().parents[1]
SHAPES_STACK = "shapes"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_path")
    world = build_world(root / "world")
    # Unfitted: it writes random tokens up to the length limit, so every completion is long and every
    # group's rewards are equal (all syntax errors).
    random_policy = build_policy(root / "random", world, fit_steps=0)
    return world, random_policy


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, assets):
    """A policy fitted briefly on the world's gold programs: its samples differ in reward."""
    world, _ = assets
    return world, build_policy(tmp_path_factory.mktemp("fitted"), world)


def _recipe(tmp_path, assets, **values) -> Path:
    world, policy = assets
    base = dict(
        model_name_or_path=str(policy),
        dataset_root=str(world),
        tool_stack=SHAPES_STACK,
        output_dir=str(tmp_path / "run"),
        warmup_steps=0,
        per_device_train_batch_size=16,
    )
    return write_recipe(tmp_path / "recipe.yaml", **{**base, **values})


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _adapter_finite(run: Path) -> bool:
    from safetensors.torch import load_file

    weights = load_file(str(run / "adapter" / "adapter_model.safetensors"))
    return bool(weights) and all(bool(t.isfinite().all()) for t in weights.values())


def test_rloo_zero_variance_filter_stays_finite_on_long_completions(tmp_path, assets):
    """Fault: the filter zeroed RLOO's completion mask after the old log-probabilities were summed
    under the full mask, so a filtered row's ratio was exp(-old_logps): infinite once a completion's
    summed log-probability is below about -88.7 (here ~ -6 per token x 96 tokens), and the loss NaN."""
    from vprl.train.rl import main

    recipe = _recipe(
        tmp_path,
        assets,
        algorithm="rloo",
        beta=0.05,
        max_steps=1,
        filter_zero_variance=True,
        stop_at_program_end=False,
        max_completion_length=96,
        temperature=1.0,
        top_p=1.0,
        logging_nan_inf_filter=False,  # trl's logs would otherwise hide a NaN loss as 0
    )
    main(["--config", str(recipe)])
    run = tmp_path / "run"
    (step,) = [m for m in _metrics(run) if "loss" in m]
    assert step["zero_variance/filtered_share"] == 1.0  # every group filtered: nothing may move
    assert step["completions/mean_length"] > 80
    assert math.isfinite(step["loss"]) and math.isfinite(step["grad_norm"])
    assert step["loss"] == 0.0 and _adapter_finite(run)


def test_a_program_cut_at_its_stop_sequence_ends_with_eos(tmp_path, fitted, monkeypatch):
    """Fault: completions cut at the stop sequence lost their end, so trl counted every one as
    clipped (`completions/clipped_ratio` 1.0 on every dashboard) and the policy never learned to end."""
    import trl.trainer.grpo_trainer as grpo_trainer

    import vprl.train.recipe.checks
    from vprl.train.rl import main

    monkeypatch.setattr(grpo_trainer, "VLLMGeneration", FakeVLLMGeneration)
    monkeypatch.setattr(vprl.train.recipe.checks, "require_vllm", lambda key: None)  # vLLM is not installed here
    FakeVLLMGeneration.instances.clear()
    recipe = _recipe(
        tmp_path,
        fitted,
        max_steps=1,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_importance_sampling_correction=True,
        top_p=1.0,
    )
    main(["--config", str(recipe)])
    (step,) = [m for m in _metrics(tmp_path / "run") if "loss" in m]
    assert step["completions/clipped_ratio"] == 0.0
    assert step["completions/mean_terminated_length"] == step["completions/mean_length"]
    assert math.isfinite(step["loss"])
    # the appended EOS is no sampled token: it stays out of vLLM's importance weight (#24, fault 1)
    assert step["sampling/importance_sampling_ratio/min"] == pytest.approx(1.0, abs=1e-4)


def _wandb_warnings(run: Path) -> str:
    (offline,) = run.glob("wandb/offline-run-*")
    return (offline / "logs" / "debug-internal.log").read_text()


def test_wandb_keeps_every_program_table(tmp_path, fitted, monkeypatch):
    """Fault: the program table was logged with `step=global_step` while wandb's own step (advanced by
    every trainer log call) was ahead, so wandb ignored each table's history record."""
    from vprl.train.rl import main

    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WANDB_PROJECT", "vprl-test")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    recipe = _recipe(tmp_path, fitted, max_steps=2, report_to="wandb", program_table_steps=1)
    try:
        main(["--config", str(recipe)])
    finally:
        import wandb

        wandb.finish()
        wandb.teardown()  # wandb keeps the first run's settings (WANDB_DIR) for the process otherwise
        os.environ.pop("WANDB_MODE", None)  # set by the entry point (no credentials: offline)
        os.environ.pop("WANDB_DIR", None)
    log = _wandb_warnings(tmp_path / "run")
    assert "ignoring partial history record" not in log
    tables = sorted((tmp_path / "run").glob("wandb/offline-run-*/files/media/table/programs/step_*.table.json"))
    # one per optimizer step, each file named by the trainer's step (wandb's own runs ahead)
    assert [p.name.split("_")[1] for p in tables] == ["1", "2"], tables


def test_wandb_login_credentials_give_an_online_run(tmp_path, monkeypatch):
    """Fault: only WANDB_API_KEY counted as credentials, so a user who ran `wandb login` (which writes
    ~/.netrc) got an offline run."""
    from vprl.train.recipe.rl_config import parse_rl_config
    from vprl.train.rl import setup_reporting

    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    # set here so that the values setup_reporting gives them are undone after the test
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_PROJECT", "vprl-test")
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "0" * 40 + "\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    cfg = parse_rl_config(["--output_dir", str(tmp_path / "run"), "--report_to", "wandb"])
    setup_reporting(cfg)
    assert "WANDB_MODE" not in os.environ
    monkeypatch.setenv("NETRC", str(tmp_path / "missing"))
    setup_reporting(cfg)
    assert os.environ["WANDB_MODE"] == "offline"
    monkeypatch.delenv("WANDB_MODE")


@pytest.mark.parametrize(("split", "subtype"), [("test", "test2015"), ("test-dev", "test-dev2015")])
def test_vqav2_test_splits_read_the_2015_files_and_images(tmp_path, split, subtype):
    """Fault: `split="test"` looked for test2014 files and a test2014/ image folder; VQAv2's test and
    test-dev questions are `..._test2015_` / `..._test-dev2015_` files whose images are all in
    test2015/ as COCO_test2015_*.jpg."""
    from vprl.data.loaders import load_dataset

    questions = {
        "data_subtype": subtype,
        "questions": [{"image_id": 1, "question": "What is on the table?", "question_id": 10}],
    }
    (tmp_path / f"v2_OpenEnded_mscoco_{subtype}_questions.json").write_text(json.dumps(questions))
    (tmp_path / "test2015").mkdir()
    (tmp_path / "test2015" / "COCO_test2015_000000000001.jpg").write_bytes(b"\xff\xd8\xff")
    (example,) = load_dataset("vqav2", tmp_path, split, check_images=True)
    assert example.image == str(tmp_path / "test2015" / "COCO_test2015_000000000001.jpg")
    assert example.answers == () and example.query == "What is on the table?"


def test_evaluation_and_stanic_place_the_policy_like_training(tmp_path, fitted, monkeypatch):
    """Fault: evaluation and `vprl.train.ace stanic` loaded the policy with no dtype and no device, so a 7B
    policy ran in fp32 on the CPU. Now both go through `vprl.train.policy.loading.load_for_sampling`: the
    recipe's dtype, the GPU when there is one (faked here), 4/8-bit as configured."""
    import torch
    from transformers import AutoModelForCausalLM

    from vprl.train.ace.stanic import stanic_generator
    from vprl.train.evaluation.config import EvalConfig
    from vprl.train.evaluation.plan import Policy
    from vprl.train.evaluation.session import policy_generator
    from vprl.train.recipe.sections import PolicyArgs

    _, policy = fitted
    cfg = EvalConfig(model_name_or_path=str(policy), torch_dtype="bfloat16", generator="hf", batch_size=4)
    assert policy_generator(cfg, Policy("base", None)).model.dtype == torch.bfloat16
    stanic = stanic_generator(PolicyArgs(model_name_or_path=str(policy), torch_dtype="bfloat16"), 4)
    assert stanic.model.dtype == torch.bfloat16

    seen = []
    real = AutoModelForCausalLM.from_pretrained

    def recording(path, **kwargs):
        seen.append(kwargs)
        return real(path, dtype=kwargs["dtype"])  # the CPU stands in for the GPU it was placed on

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", recording)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    policy_generator(EvalConfig(model_name_or_path=str(policy), generator="hf"), Policy("base", None))
    assert seen[-1]["dtype"] == torch.bfloat16 and seen[-1]["device_map"] == {"": "cuda:0"}


def test_evaluation_samples_with_vllm_where_it_can(tmp_path, fitted, monkeypatch):
    """The same fault's other half: with vLLM installed and a GPU, evaluation samples with vLLM's
    engine serving the adapter (here a stand-in for vLLM's classes), not with transformers."""
    import importlib.util

    import torch

    from vprl.train.evaluation.config import EvalConfig
    from vprl.train.evaluation.plan import Policy, choose_generator
    from vprl.train.evaluation.session import policy_generator
    from vprl.train.sampling import vllm_engine

    _, policy = fitted
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8}))
    cfg = EvalConfig(model_name_or_path=str(policy))
    assert choose_generator(cfg) == "hf"  # here: no vLLM, no GPU
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "vllm" else real_find_spec(name))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    import vprl.train.evaluation.memory as memory
    import vprl.train.evaluation.session as session

    monkeypatch.setattr(session, "gpu_totals", lambda: [80.0])  # the faked GPU, empty: the engine's share is free
    monkeypatch.setattr(memory, "free_gib", lambda device: 80.0)
    types = vllm_engine.VLLMTypes(sampling_params=dict, lora_request=lambda name, i, path: (name, i, path))
    monkeypatch.setattr(vllm_engine.VLLMTypes, "load", classmethod(lambda cls: types))
    generator = policy_generator(cfg, Policy("rl", str(adapter)))
    assert isinstance(generator, vllm_engine.VLLMGenerator) and generator.max_lora_rank == 8
    assert generator.lora_request[2] == str(adapter.resolve()) and generator.engine is None  # built on first use


def test_a_clipped_recipe_clips(tmp_path, fitted):
    """Fault: every recipe ran one update per generation, so the PPO ratio was 1 and epsilon inert. The
    shipped clipped recipe reuses each generation for several updates; at the tiny model's scale the
    same settings move the ratio past 1 +- epsilon, and trl's clip ratio is no longer zero."""
    import yaml

    from vprl.train.rl import main

    clipped = yaml.safe_load((REPO / "configs/grpo_codellama_gqa_correctness_clipped.yaml").read_text())
    assert clipped["num_iterations"] > 1 and clipped["epsilon"] == 0.2
    recipe = _recipe(
        tmp_path,
        fitted,
        num_iterations=clipped["num_iterations"],
        epsilon=clipped["epsilon"],
        learning_rate=5e-2,
        max_steps=clipped["num_iterations"],
        save_steps=clipped["num_iterations"],
    )
    main(["--config", str(recipe)])
    steps = [m for m in _metrics(tmp_path / "run") if "loss" in m]
    assert len(steps) == clipped["num_iterations"]
    assert steps[0]["clip_ratio/region_mean"] == 0.0  # the first update: the ratio is still 1
    assert max(m["clip_ratio/region_mean"] for m in steps[1:]) > 0.0


def test_recipes_state_beta_dropout_and_objective_and_share_beta_across_algorithms():
    """Faults: RLOO kept trl's beta 0.05 where GRPO had 0 (a GRPO-vs-RLOO comparison changed two
    things), dropout made the old and new passes disagree, and no recipe said which objective it
    optimises. Every shipped recipe now says so; beta and disable_dropout are the same for both."""
    import yaml

    from vprl.rewards.registry import build_reward
    from vprl.train.recipe.rl_config import parse_rl_config

    grpo = parse_rl_config(["--output_dir", "x"]).training
    rloo = parse_rl_config(["--output_dir", "x", "--algorithm", "rloo"]).training
    assert grpo.beta == rloo.beta == 0.0 and grpo.disable_dropout and rloo.disable_dropout
    for path in sorted(REPO.glob("configs/*.yaml")):
        text = path.read_text()
        recipe = yaml.safe_load(text)
        assert "# Objective:" in text, path.name
        if recipe["algorithm"] in ("grpo", "rloo"):
            assert "beta" in recipe and recipe.get("disable_dropout", True) is True, path.name
        for reward in recipe.get("rewards", []):
            if isinstance(reward, dict) and reward.get("name") == "unit_tests" and "gqa" in path.name:
                assert reward["settings"]["compile_penalty"] > 0 and reward["settings"]["runtime_penalty"] > 0
            # every reward a recipe names can be built as written (models load lazily: nothing loads here)
            name, settings = (reward, {}) if isinstance(reward, str) else (reward["name"], reward.get("settings", {}))
            build_reward(name, {"runner": object(), "tool_host": object()}, **settings)


def test_dropout_off_makes_the_old_and_new_passes_agree(tmp_path, fitted):
    """Fault: with LoRA dropout 0.05 and trl's dropout left on, two passes over the same batch in
    train mode disagree; with the recipes' `disable_dropout` the trainer's model is deterministic."""
    import torch

    from vprl.rewards.compose import RewardComposer
    from vprl.train.online.run import build_trainer
    from vprl.train.recipe.checks import validate
    from vprl.train.recipe.data import build_prompts
    from vprl.train.recipe.rl_config import parse_rl_config

    cfg = parse_rl_config(["--config", str(_recipe(tmp_path, fitted, lora_dropout=0.5, report_to="none"))])
    checked = validate(cfg)
    prompted = build_prompts(checked.examples[:1], checked.prompts)
    trainer, _ = build_trainer(cfg, prompted, RewardComposer(checked.rewards), None, tmp_path)
    model = trainer.model
    model.train()
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)


def test_rest_keeps_warmup_steps_of_one_or_more(tmp_path):
    """Fault: the ReST loop turned `warmup_steps >= 1` (a step count) into 0."""
    from vprl.train.recipe.rl_config import parse_rl_config
    from vprl.train.rest.sft import iteration_args

    cfg = parse_rl_config(["--output_dir", str(tmp_path), "--algorithm", "rest", "--warmup_steps", "3"])
    assert iteration_args(cfg.training, tmp_path / "iter").warmup_steps == 3


def test_unit_test_cache_lives_in_the_run_folder(tmp_path):
    """Fault: without a `cache_dir` the unit-test cache was a temporary folder, so a restarted run wrote
    and drew every test again; with the run folder handed over as a resource, it persists there."""
    from vprl.rewards.registry import build_reward

    reward = build_reward("unit_tests", {"runner": object(), "run_dir": str(tmp_path)})
    assert reward.config.cache_dir == str(tmp_path / "unit_test_cache")


def test_self_tuning_on_the_hf_stack_can_be_configured():
    """Fault: self-tuning overrides were checked against `HFBackend.__init__`'s signature, which takes
    one free-form mapping, so `{"detect": ...}` was refused as unknown on the paper stacks. Now each
    backend checks its own settings, and a tool's section is merged, not replaced."""
    from vprl.executor.tools.stack import read_tool_stack, stack_settings
    from vprl.train.evaluation.config import EvalConfig
    from vprl.train.evaluation.plan import check_tools, mode_configs

    stack = "viunit"
    cfg = EvalConfig(tool_stack=stack, modes="self_tuning", self_tuning='{"detect": {"box_threshold": 0.1}}')
    check_tools(cfg, mode_configs(cfg))
    merged = stack_settings(read_tool_stack(stack), {"detect": {"box_threshold": 0.1}})
    assert merged["detect"]["box_threshold"] == 0.1 and merged["detect"]["model"].startswith("IDEA-Research/")
    typo = EvalConfig(tool_stack=stack, modes="self_tuning", self_tuning='{"detect": {"box_treshold": 0.1}}')
    with pytest.raises(ValueError, match=r"self_tuning: .*box_treshold"):
        check_tools(typo, mode_configs(typo))


def test_unit_tests_can_be_prepared_so_training_never_loads_the_writer_or_generator(tmp_path, fitted):
    """Fault (part): the unit-test recipes put the writer LLM and the image generator on the GPU next
    to the policy. Tests depend on the question only, so `python -m vprl.train.prepare_unit_tests` makes
    them all first, into the run folder's cache; the training run then finds every test and image
    there (no writer call, no image drawn), so neither model is ever loaded during RL."""
    from vprl.executor.host import ToolHost
    from vprl.executor.runner import RunnerConfig, SyncRunner
    from vprl.executor.tools.stack import build_backend
    from vprl.rewards.registry import build_reward
    from vprl.train.prepare_unit_tests import main as prepare

    world, _ = fitted
    recipe = _recipe(tmp_path, fitted, rewards=[{"name": "unit_tests", "settings": {"num_tests": 3}}])
    summary = prepare(["--config", str(recipe)])
    assert summary["queries"] > 0 and summary["images"] > 0 and summary["tests_written"] == summary["queries"]
    from vprl.train.recipe.checks import validate
    from vprl.train.recipe.rl_config import parse_rl_config

    examples = validate(parse_rl_config(["--config", str(recipe)])).examples[:6]
    with SyncRunner(ToolHost(build_backend(SHAPES_STACK)), RunnerConfig(slots=1)) as runner:
        reward = build_reward("unit_tests", {"runner": runner, "run_dir": str(tmp_path / "run")}, num_tests=3)
        reward.evaluate([e.query for e in examples], ["def execute_command(image):\n    return 'yes'\n"] * 6)
    stats = reward.cache.stats
    assert stats.tests_written == 0 and stats.images_generated == 0 and stats.tests_reused > 0
