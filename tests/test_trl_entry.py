"""vprl's rewards in a plain trl script (`vprl.train.integrations.for_trl`, issue #26): the example script
trains two GRPO steps on the CPU with correctness and unit-test rewards and the sandboxed executor;
the functions follow trl's reward contract for plain and conversational completions and add up to
vprl's composed total; the executor starts on first use and closes; tool stacks resolve by name."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fixed_policy import build_fixed_policy
from rl_tiny import build_world

from vprl.executor.runner_config import RunnerConfig
from vprl.executor.tools import stack
from vprl.train.integrations.for_trl import EXAMPLE_COLUMN, load_examples, program_rewards, trl_dataset
from vprl.train.integrations.session import SessionConfig, reward_config
from vprl.train.prompts import completion_to_program

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "trl_grpo.py"
RUNNER = RunnerConfig(slots=2)
BODIES = {
    "constant": "\n    return 'yes'\n",
    "syntax_error": "\n    return (\n",
    "runtime_error": "\n    return 1/0\n",
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("trl_entry") / "world")


@pytest.fixture(scope="module")
def policy(world, tmp_path_factory):
    # Every completion is one program that runs, whatever the CPU's kernels: a fitted tiny policy
    # wrote some on AVX2 machines and none on AVX-512 ones, and the verdict followed the CPU.
    return build_fixed_policy(tmp_path_factory.mktemp("trl_policy") / "policy", world, BODIES["constant"])


SAMPLE = """import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model, tok = AutoModelForCausalLM.from_pretrained(sys.argv[1]), AutoTokenizer.from_pretrained(sys.argv[1])
torch.manual_seed(0)
ids = tok(["# Is there a red circle?\\ndef execute_command(image) -> str:"] * 16, return_tensors="pt")
out = model.generate(**ids, do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=8)
print(repr(sorted({tok.decode(o[ids["input_ids"].shape[1]:], skip_special_tokens=True) for o in out})))
"""


@pytest.mark.parametrize("capability", [None, "avx2", "default"], ids=["native", "avx2", "scalar"])
def test_item4_the_policy_writes_its_program_whatever_the_kernels(policy, capability):
    """The example-script tests' verdict may not follow the CPU: torch's vectorised and scalar
    kernels round differently, and the policy's samples must not care (ATEN_CPU_CAPABILITY picks them)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    done = subprocess.run(
        [sys.executable, "-c", SAMPLE, str(policy)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == repr([BODIES["constant"]])


def _run_example(cwd: Path, world: Path, policy: Path, out: Path, script: Path = EXAMPLE):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)  # what a user's shell has: the installed vprl, nothing of the tests
    argv = [sys.executable, str(script), "--model_name_or_path", str(policy), "--world", str(world), "--out", str(out)]
    argv += ["--prompt_layout", "bare", "--cpu"]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=540)


def _logged_steps(stdout: str) -> list[dict]:
    """The per-step log dicts trl prints (one line each, with the loss)."""
    steps = []
    for line in stdout.splitlines():
        start = line.find("{'loss'")
        if start >= 0:
            steps.append(ast.literal_eval(line[start : line.rindex("}") + 1]))
    return steps


def _check_trained(done: subprocess.CompletedProcess, out: Path) -> None:
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TrainOutput(global_step=2" in done.stdout
    steps = _logged_steps(done.stdout + done.stderr)
    assert len(steps) == 2
    for name in ("rewards/correctness/mean", "rewards/unit_tests/mean", "rewards/failure_penalty/mean", "exec/ok"):
        assert all(name in s for s in steps), name
    # every program (the policy writes one that runs) ran in the sandbox and was judged by both rewards
    assert [float(s["exec/ok"]) for s in steps] == [1.0, 1.0]
    assert all(s["rewards/correctness/mean"] is not None for s in steps)
    assert all(s["rewards/unit_tests/mean"] is not None for s in steps)
    assert (out / "model.safetensors").is_file()


@pytest.mark.timeout(900)
def test_the_example_script_trains_two_grpo_steps_on_the_cpu(world, policy, tmp_path):
    lines = [line for line in EXAMPLE.read_text().splitlines() if line.strip()]
    assert len(lines) <= 32, "the example is meant to stay a short script"
    imports = [line for line in lines if line.startswith(("import ", "from "))]
    assert {line.split()[1].split(".")[0] for line in imports} <= {"argparse", "trl", "vprl"}
    assert [line for line in imports if line.startswith("from vprl")] == [
        "from vprl.train.integrations.for_trl import load_examples, program_rewards, trl_dataset"
    ]
    _check_trained(_run_example(tmp_path, world, policy, tmp_path / "out"), tmp_path / "out")


@pytest.mark.timeout(900)
def test_the_example_runs_from_a_project_with_packages_named_like_ours(world, policy, tmp_path):
    # The user's packages hold modules with names as common as our layers' (data, train, rewards,
    # executor): the script runs from the project's folder, first on sys.path, and must still
    # find vprl's own.
    project = tmp_path / "project"
    for package, module in (
        ("data", "records"),
        ("train", "prompts"),
        ("rewards", "registry"),
        ("executor", "runner"),
    ):
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text(f'"""The user\'s own {package} package."""\n')
        (project / package / f"{module}.py").write_text(f'"""The user\'s {package}.{module}."""\n')
    script = project / "trl_grpo.py"  # the example copied into the user's project, as users do
    script.write_text(EXAMPLE.read_text())
    _check_trained(_run_example(project, world, policy, project / "out", script), project / "out")


def _call(rewards, prompts, completions, examples, **extra):
    """Every reward function of one batch, gathered on one loop as trl does."""
    column = [json.dumps(ex.to_json(), sort_keys=True) for ex in examples]

    async def batch():
        calls = [
            f(prompts=prompts, completions=completions, **{EXAMPLE_COLUMN: column}, **extra) for f in rewards.funcs
        ]
        return await asyncio.gather(*calls)

    return asyncio.run(batch())


def _completions(world):
    from vprl.data.shapes import load_gold_programs

    examples = load_examples("shapes", str(world), tasks=["train"])[:2]
    gold = load_gold_programs(world)["vqa"]
    bodies = ["\n" + gold[ex.query].split("\n", 1)[1] for ex in examples]
    picked = [examples[0], examples[1], examples[0], examples[0], examples[1]]
    texts = [bodies[0], bodies[1], BODIES["constant"], BODIES["syntax_error"], BODIES["runtime_error"]]
    return picked, texts


@pytest.mark.parametrize("conversational", [False, True], ids=["plain", "conversational"])
def test_the_functions_add_up_to_the_composed_total(world, conversational):
    examples, texts = _completions(world)
    dataset = trl_dataset(examples, layout="bare", conversational=conversational)
    prompts = list(dataset["prompt"])
    completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
    weights = {"correctness": 1.0, "executes": 0.25}
    with program_rewards(weights, tool_stack="shapes", runner=RUNNER, penalties={"runtime_error": -0.3}) as rewards:
        assert not rewards.session.started  # nothing runs before the first batch
        assert [f.__name__ for f in rewards.funcs] == ["correctness", "executes", "failure_penalty"]
        assert rewards.weights == [1.0, 0.25, 1.0]
        values = _call(rewards, prompts, completions, examples)
        assert rewards.session.started
        tail = dataset[0]["prompt"] if not conversational else dataset[0]["prompt"][-1]["content"]
        scored = rewards.session.score(examples, [completion_to_program(tail, t) for t in texts])
    assert scored.rewards.statuses == ["ok", "ok", "ok", "syntax_error", "runtime_error"]
    for i, total in enumerate(scored.rewards.totals):
        parts = [w * v[i] for w, v in zip(rewards.weights, values, strict=True) if v[i] is not None]
        assert (sum(parts) if parts else None) == pytest.approx(total), i
    assert values[2][3:] == [-1.0, -0.3]  # the failures carry their penalties, nothing else
    assert values[0][3:] == [0.0, 0.0] and values[1] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert not rewards.session.started  # closed at the end of the block


def test_a_trainer_weighing_the_rewards_otherwise_is_refused(world):
    examples, texts = _completions(world)
    prompts = list(trl_dataset(examples, layout="bare")["prompt"])

    class Trainer:  # what trl's GRPOTrainer exposes to its reward functions through log_metric
        def __init__(self, funcs, weights):
            self.reward_funcs, self.reward_weights, self.logged = funcs, weights, {}

        def _log_metric(self, name, value):
            self.logged[name] = value

    with program_rewards({"correctness": 2.0}, tool_stack="shapes", runner=RUNNER) as rewards:
        forgot = Trainer(rewards.funcs, [1.0, 1.0])  # GRPOConfig without reward_weights
        with pytest.raises(ValueError, match=r"reward_weights=rewards.weights"):
            _call(rewards, prompts, texts, examples, log_metric=forgot._log_metric)
        right = Trainer(rewards.funcs, rewards.weights)
        values = _call(rewards, prompts, texts, examples, log_metric=right._log_metric)
        assert len(values) == 2 and right.logged["exec/syntax_error"] == pytest.approx(0.2)


def test_a_dataset_without_the_example_column_is_named(world):
    examples, texts = _completions(world)
    with program_rewards("correctness", runner=RUNNER) as rewards:
        with pytest.raises(ValueError, match=f"no '{EXAMPLE_COLUMN}' column.*trl_dataset"):
            asyncio.run(rewards.funcs[0](prompts=["p"] * 5, completions=texts, example_id=["x"] * 5))
        assert not rewards.session.started


def test_the_session_starts_once_and_stays_closed(world):
    rewards = program_rewards("correctness", runner=RUNNER)
    assert rewards.start() is rewards and rewards.session.started
    scorer = rewards.session.start()
    assert rewards.session.start() is scorer
    rewards.close()
    assert not rewards.session.started
    with pytest.raises(RuntimeError, match="closed"):
        rewards.start()


def test_the_dataset_holds_prompts_and_examples(world):
    examples = load_examples("shapes", str(world), tasks=["train", "val"])
    plain = trl_dataset(examples, layout="bare")
    assert plain.column_names == ["prompt", EXAMPLE_COLUMN] and len(plain) == len(examples)
    assert plain[0]["prompt"].rstrip().endswith("def execute_command(image) -> str:")
    assert json.loads(plain[0][EXAMPLE_COLUMN]) == examples[0].to_json()
    chat = trl_dataset(examples, conversational=True)
    assert chat[0]["prompt"][0]["role"] == "user" and "ImagePatch" in chat[0]["prompt"][0]["content"]
    with pytest.raises(ValueError, match="PromptConfig"):
        trl_dataset(examples, layot="bare")
    with pytest.raises(ValueError, match="tasks="):
        load_examples("gqa", str(world / "gqa"), tasks=["train"])


def test_rewards_are_named_as_a_user_writes_them():
    assert [s.name for s in reward_config("correctness").rewards] == ["correctness"]
    spec = reward_config([{"name": "unit_tests", "weight": 0.5, "settings": {"num_tests": 3}}]).rewards[0]
    assert (spec.weight, spec.settings) == (0.5, {"num_tests": 3})
    with pytest.raises(ValueError, match=r"rewards\[1\]: unknown reward 'corectness'; registered rewards"):
        SessionConfig(rewards=reward_config(["correctness", "corectness"]))
    with pytest.raises(ValueError, match="named once"):
        SessionConfig(rewards=reward_config(["correctness", "correctness"]))
    with pytest.raises(ValueError, match="penalties"):
        reward_config("correctness", {"syntax_eror": -1.0})


def test_the_session_config_round_trips_and_names_a_bad_field():
    config = SessionConfig(
        rewards=reward_config({"correctness": 1.0}), tool_stack="viunit", runner=RunnerConfig(slots=3)
    )
    assert SessionConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    with pytest.raises(ValueError, match=r"settings.json: runner: slots: expected an integer"):
        SessionConfig.from_json({"runner": {"slots": "3"}}, "settings.json")
    with pytest.raises(ValueError, match=r"settings.json: unknown key\(s\) \['tool'\]"):
        SessionConfig.from_json({"tool": "shapes"}, "settings.json")


def test_tool_stacks_resolve_by_name(tmp_path, monkeypatch):
    assert stack.stack_path("shapes") == REPO / "vprl" / "executor" / "tools" / "stacks" / "shapes.yaml"
    assert stack.read_tool_stack("viunit")["backend"] == "hf"
    assert {"shapes", "viunit", "oracle"} <= set(stack.stack_names())
    with pytest.raises(FileNotFoundError, match=r"'shape'.*named stacks: \[.*'shapes'"):
        stack.read_tool_stack("shape")
    # a path is a path, a file of a stack's name in the working directory included
    assert stack.read_tool_stack(str(stack.NAMED_STACKS / "shapes.yaml"))["backend"] == "shapes"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "viunit").write_text(yaml.safe_dump({"backend": "shapes"}))
    assert stack.read_tool_stack("viunit")["backend"] == "shapes"


def test_item5_program_rewards_used_as_a_subset_keep_a_bounded_number_of_batches(world):
    examples, texts = _completions(world)
    prompts = list(trl_dataset(examples, layout="bare")["prompt"])
    column = [json.dumps(ex.to_json(), sort_keys=True) for ex in examples]
    with program_rewards({"correctness": 1.0, "executes": 0.25}, runner=RUNNER) as rewards:
        kept = []
        for i in range(6):
            batch = [t + f"\n    # {i}\n" for t in texts]  # another batch each time, the same programs
            full = _call(rewards, prompts, batch, examples)

            async def subset(batch=batch):
                funcs = rewards.funcs[:-1]  # without failure_penalty
                return await asyncio.gather(
                    *[f(prompts=prompts, completions=batch, **{EXAMPLE_COLUMN: column}) for f in funcs]
                )

            assert asyncio.run(subset()) == full[:-1], i
            kept.append(len(rewards.adapter._batches))
    assert max(kept) <= 2, kept
