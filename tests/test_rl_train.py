"""`vprl/train/rl.py` end to end on a CPU: a tiny policy, the shapes world, the real sandboxed executor with
the pixel-only `shapes` tools. GRPO and RLOO train and change the adapter; the vLLM code path runs
with a fake engine; a run killed with SIGKILL resumes from its last checkpoint without losing or
duplicating rollout rows; two processes (torchrun path, gloo) train a step."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from rl_tiny import FakeVLLMGeneration, build_policy, build_world, offline_wandb, write_recipe

from vprl.train.rollouts.log import RolloutLog

REPO = Path(__file__).resolve().parents[1]
SHAPES_STACK = "shapes"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl")
    world = build_world(root / "world")
    policy = build_policy(root / "policy", world)
    return world, policy


def _recipe(tmp_path, assets, **values):
    world, policy = assets
    base = dict(
        model_name_or_path=str(policy),
        dataset_root=str(world),
        tool_stack=SHAPES_STACK,
        output_dir=str(tmp_path / "run"),
        warmup_steps=0,
        per_device_train_batch_size=16,  # 4 prompts x 4 samples
    )
    return write_recipe(tmp_path / "recipe.yaml", **{**base, **values})


def _rest_recipe(tmp_path, assets, **values) -> Path:
    """The GRPO test recipe turned into a one-iteration `rest` one over 4 prompts x 2 samples."""
    recipe = yaml.safe_load(_recipe(tmp_path, assets).read_text())
    for key in ("num_generations", "max_completion_length", "save_steps"):
        recipe.pop(key)
    recipe.update(
        algorithm="rest", rest_iterations=1, num_generations=2, dataset_limit=4, per_device_train_batch_size=2
    )
    recipe.update(values)
    path = tmp_path / "rest.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _lora_b_norm(adapter: Path) -> float:
    from safetensors.torch import load_file

    weights = load_file(str(adapter / "adapter_model.safetensors"))
    lora_b = [t for k, t in weights.items() if "lora_B" in k]
    assert lora_b, "no LoRA B matrices in the adapter"
    return float(sum(t.abs().sum() for t in lora_b))


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _assert_learned_something(run: Path) -> None:
    steps = [m for m in _metrics(run) if "zero_variance/share" in m]
    # LoRA B starts at zero; it moves only if some group had different rewards (a real signal).
    assert any(m["zero_variance/share"] < 1 for m in steps), "every group had equal rewards: nothing to learn"
    assert _lora_b_norm(run / "adapter") > 0


def test_grpo_trains_and_writes_the_run_folder(tmp_path, assets):
    from vprl.train.rl import main

    adapter = main(["--config", str(_recipe(tmp_path, assets, max_steps=2))])
    run = tmp_path / "run"
    assert adapter == run / "adapter" and (adapter / "tokenizer.json").is_file()
    _assert_learned_something(run)
    rows = RolloutLog.in_run(run).read()
    assert Counter(r.step for r in rows) == {1: 16, 2: 16}
    manifest = json.loads((run / "manifest.json").read_text())
    assert {r.prompt_hash for r in rows} == {manifest["prompt_hash"]}
    assert manifest["algorithm"] == "grpo" and manifest["policy"]["base_model"] == str(assets[1])
    assert manifest["tool_stack"]["config"]["backend"] == "shapes" and manifest["dataset"]["split_id"]
    assert manifest["packages"]["trl"] and "commit" in manifest["git"]
    assert manifest["rewards"]["rewards"][0]["name"] == "correctness"
    statuses = Counter(r.status for r in rows)
    assert statuses["ok"] > 0 and all(r.components.keys() == {"correctness"} for r in rows)
    assert any(r.tool_calls for r in rows if r.status == "ok")
    logged = _metrics(run)
    assert [m["step"] for m in logged if "loss" in m] == [1, 2]
    assert {"exec/ok", "exec/syntax_error", "tools/cache_hit_rate", "rewards/correctness/mean"} <= set(logged[0])
    # the resolved recipe reads back
    from vprl.train.recipe.rl_config import parse_rl_config

    assert parse_rl_config(["--config", str(run / "config.yaml")]).to_flat() == yaml.safe_load(
        (run / "config.yaml").read_text()
    )
    # #29 item 3: the cards a user sees are the project's, not trl's or peft's templates
    for card in (run / "README.md", adapter / "README.md"):
        text = card.read_text()
        assert "a vprl visual-program generator adapter" in text and str(assets[1]) in text, card
        assert "\nlicense: " in text and "<QUESTION>" in text, card
        assert "fine-tuned version of [None]" not in text and "[More Information Needed]" not in text, card


def test_rloo_trains_with_the_zero_variance_filter_and_logs_to_wandb(tmp_path, assets, monkeypatch):
    from vprl.train.rl import main

    recipe = _recipe(
        tmp_path,
        assets,
        algorithm="rloo",
        max_steps=2,
        filter_zero_variance=True,
        report_to="wandb",
        program_table_steps=1,
    )
    with offline_wandb(monkeypatch):
        main(["--config", str(recipe)])
    run = tmp_path / "run"
    _assert_learned_something(run)
    assert all("zero_variance/filtered_share" in m for m in _metrics(run) if "loss" in m)
    assert Counter(r.step for r in RolloutLog.in_run(run).read()) == {1: 16, 2: 16}
    # offline wandb run inside the run folder, with the programs table of every step
    (offline,) = run.glob("wandb/offline-run-*")
    tables = sorted(offline.glob("files/media/table/programs/step_*.table.json"))
    assert [p.name.split("_")[1] for p in tables] == ["1", "2"]  # named by the optimizer step
    table = json.loads(tables[0].read_text())
    assert "program" in table["columns"] and len(table["data"]) == 16


def test_vllm_path_with_a_fake_engine(tmp_path, assets, monkeypatch):
    import trl.trainer.grpo_trainer as grpo_trainer

    import vprl.train.recipe.checks
    import vprl.train.rl

    monkeypatch.setattr(grpo_trainer, "VLLMGeneration", FakeVLLMGeneration)
    monkeypatch.setattr(
        vprl.train.recipe.checks, "require_vllm", lambda key: None
    )  # vLLM itself is not installed here
    FakeVLLMGeneration.instances.clear()
    recipe = _recipe(
        tmp_path,
        assets,
        max_steps=1,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_importance_sampling_correction=False,
        top_p=1.0,  # the fake scripts its completions
    )
    vprl.train.rl.main(["--config", str(recipe)])
    (engine,) = FakeVLLMGeneration.instances
    assert engine.calls == 1 and engine.synced >= 1
    assert "\n#" in engine.kwargs["generation_kwargs"]["stop"]  # vLLM stops at the end of the program itself
    run = tmp_path / "run"
    rows = RolloutLog.in_run(run).read()
    assert {r.status for r in rows} >= {"ok", "runtime_error"}
    assert not any("red circle" in r.program for r in rows)
    # completions were cut after the stop: the loss covered the programs, not the tail
    (logged,) = [m for m in _metrics(run) if "loss" in m]
    assert logged["completions/max_length"] < min(engine.raw_lengths)
    _assert_learned_something(run)


def _launch(args: list[str], log: Path, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen(
        args, cwd=REPO, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True, **kwargs
    )


def test_sigkill_then_the_same_command_resumes(tmp_path, assets):
    recipe = _recipe(tmp_path, assets, max_steps=6, per_device_train_batch_size=8)
    run = tmp_path / "run"
    command = [sys.executable, "vprl/train/rl.py", "--config", str(recipe)]
    proc = _launch(command, tmp_path / "first.log")
    deadline = time.time() + 240
    while not (run / "checkpoint-2" / "trainer_state.json").is_file():
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert time.time() < deadline, "no checkpoint-2 within 240 s"
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the run's own process group; its sandbox supervisor follows by PDEATHSIG
    proc.wait()
    before = RolloutLog.in_run(run).read()
    killed_at = max(
        int(p.name.split("-")[1]) for p in run.glob("checkpoint-*") if (p / "trainer_state.json").is_file()
    )
    assert killed_at < 6

    second = _launch(command, tmp_path / "second.log")
    assert second.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()[-3000:]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["resumed_from"] and manifest["resumed_from"].endswith(f"checkpoint-{killed_at}")
    assert json.loads((run / "checkpoint-6" / "trainer_state.json").read_text())["global_step"] == 6
    rows = RolloutLog.in_run(run).read()
    assert Counter(r.step for r in rows) == {step: 8 for step in range(1, 7)}  # none lost, none twice
    kept = [r for r in before if r.step <= killed_at]
    assert rows[: len(kept)] == kept  # the rows of the steps the checkpoint holds are untouched
    assert [m["step"] for m in _metrics(run) if "loss" in m] == list(range(1, 7))
    assert (run / "adapter" / "adapter_model.safetensors").is_file()


def test_two_processes_train_a_step(tmp_path, assets):
    recipe = _recipe(tmp_path, assets, max_steps=1, per_device_train_batch_size=8, executor_slots=1)
    accelerate = str(Path(sys.executable).parent / "accelerate")
    command = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    command += [
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(29500 + os.getpid() % 500),
    ]
    command += ["vprl/train/rl.py", "--config", str(recipe)]
    proc = _launch(command, tmp_path / "ddp.log")
    assert proc.wait(timeout=300) == 0, (tmp_path / "ddp.log").read_text()[-3000:]
    log = (tmp_path / "ddp.log").read_text()
    run = tmp_path / "run"
    # each process sampled its own 2 prompts x 4; the main process wrote all of them
    assert Counter(r.step for r in RolloutLog.in_run(run).read()) == {1: 16}
    assert (run / "adapter" / "adapter_model.safetensors").is_file() and "Traceback" not in log
    assert "process 1 of 2" in log  # each process knows it is one of two: only process 0 writes the run folder


def test_qlora_grpo_step(tmp_path, assets):
    from vprl.train.rl import main

    recipe = _recipe(
        tmp_path,
        assets,
        max_steps=1,
        per_device_train_batch_size=8,
        load_in_4bit=True,
        bnb_4bit_compute_dtype="float32",
    )
    main(["--config", str(recipe)])
    run = tmp_path / "run"
    assert json.loads((run / "manifest.json").read_text())["policy"]["quantization"] == "4bit"
    from safetensors.torch import load_file

    keys = load_file(str(run / "adapter" / "adapter_model.safetensors")).keys()
    assert keys and all("lora_" in k for k in keys)  # only the adapter, no quantization state


def test_rest_dispatches_to_the_rest_loop(tmp_path, assets):
    from vprl.train.recipe.rl_config import parse_rl_config
    from vprl.train.rest.sft import iteration_args
    from vprl.train.rl import main

    recipe = _rest_recipe(tmp_path, assets, max_completion_length=48, learning_rate=1e-3)
    cfg = parse_rl_config(["--config", str(recipe)])
    # the SFT step takes the recipe's trainer arguments as they are, the loop's own fields aside
    sft = iteration_args(cfg.training, tmp_path / "iter")
    assert (cfg.rest.rest_iterations, cfg.sampling.num_generations) == (1, 2)
    assert (sft.learning_rate, sft.per_device_train_batch_size, sft.num_train_epochs, sft.max_grad_norm) == (
        1e-3,
        2,
        1.0,
        0.3,
    )
    assert sft.report_to in ([], ["none"]) and sft.completion_only_loss and sft.output_dir == str(tmp_path / "iter")
    adapter = main(["--config", str(recipe)])
    run = tmp_path / "run"
    assert (adapter / "adapter_model.safetensors").is_file() and (adapter / "tokenizer.json").is_file()
    assert (run / "iterations" / "iter-0" / "summary.json").is_file()
    assert Counter(r.step for r in RolloutLog.in_run(run).read()) == {0: 8}
    assert json.loads((run / "manifest.json").read_text())["algorithm"] == "rest"


def test_rest_with_two_processes_samples_once_and_trains_on_both(tmp_path, assets):
    """`rest` under `accelerate launch --num_processes 2`: the main process alone samples, scores,
    logs and saves; both train (DDP) on the broadcast kept set."""
    recipe = _rest_recipe(
        tmp_path,
        assets,
        max_completion_length=24,
        # keep every scored program, even one that does not parse (-1), so SFT runs whatever the briefly
        # fitted policy writes (which programs run depends on float rounding under the thread count)
        rest_keep_rule="at_least",
        rest_keep_threshold=-1.0,
        executor_slots=1,
    )
    accelerate = str(Path(sys.executable).parent / "accelerate")
    command = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    command += ["--mixed_precision", "no", "--dynamo_backend", "no"]
    command += ["--main_process_port", str(29000 + os.getpid() % 500), "vprl/train/rl.py", "--config", str(recipe)]
    proc = _launch(command, tmp_path / "ddp.log")
    assert proc.wait(timeout=300) == 0, (tmp_path / "ddp.log").read_text()[-3000:]
    assert "Traceback" not in (tmp_path / "ddp.log").read_text()
    run = tmp_path / "run"
    iterations = run / "iterations"
    assert sorted(p.name for p in iterations.iterdir()) == ["initial", "iter-0"]
    assert sorted(p.name for p in (iterations / "iter-0").iterdir() if p.name.startswith("adapter")) == ["adapter"]
    assert (iterations / "iter-0" / "adapter" / "adapter_model.safetensors").is_file()
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    # one set of rows: 4 prompts x 2 samples, written once (a second sampler would double them)
    assert Counter(r.step for r in RolloutLog.in_run(run).read()) == {0: 8}
    summary = json.loads((iterations / "iter-0" / "summary.json").read_text())
    assert summary["samples"] == 8 and summary["trained"] and summary["sft_examples"] > 0, json.dumps(summary)
    kept = (iterations / "iter-0" / "kept.jsonl").read_text().splitlines()
    assert len(kept) == summary["kept"]
    assert _lora_b_norm(run / "adapter") > 0  # LoRA B starts at zero: the DDP SFT step moved it


def test_execution_starts_before_the_reward_call(tmp_path, assets, monkeypatch):
    """RLOO with beta > 0 computes old and reference log-probabilities between generation and the reward call:
    with `overlap_execution` (the default) each batch's programs start before those passes and are
    executed once; training still moves the adapter."""
    from vprl.train.online.trainers import ProgramRLOOTrainer
    from vprl.train.rl import main
    from vprl.train.rollouts.scorer import ProgramScorer

    events: list[str] = []

    def record(cls, name, label):
        original = getattr(cls, name)
        if name == "ascore":

            async def wrapper(self, *args, **kwargs):
                events.append(label)
                return await original(self, *args, **kwargs)

        else:

            def wrapper(self, *args, **kwargs):
                events.append(label)
                return original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, wrapper)

    record(ProgramScorer, "ascore", "execute")
    record(ProgramRLOOTrainer, "_get_per_token_logps_and_entropies", "logps")
    record(ProgramRLOOTrainer, "_calculate_rewards", "rewards")
    main(["--config", str(_recipe(tmp_path, assets, algorithm="rloo", beta=0.05, max_steps=2))])
    assert events.count("rewards") == 2 and events[-1] != "execute"
    segments = "|".join(events).split("rewards")[:-1]  # what happened before each reward call
    for segment in segments:
        before = segment.strip("|").split("|")
        assert before.count("execute") == 1, events
        # the old and reference passes (the last two before the call) ran after execution started
        assert before[-2:] == ["logps", "logps"] and before.index("execute") < len(before) - 2, events
    _assert_learned_something(tmp_path / "run")
    logged = [m for m in _metrics(tmp_path / "run") if "loss" in m]
    assert all(m["timing/scoring_s"] >= m["timing/scoring_hidden_s"] >= 0 for m in logged)
