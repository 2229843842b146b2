"""A short CPU run of the quickstart recipe and a shapes evaluation, for the run viewer's tests.

The run is `vprl.train.rl` on `configs/quickstart.yaml` (GRPO, LoRA, the sandboxed executor, the
`shapes` tools, the correctness reward) on the tiny world, for two steps. Its completions are
scripted through trl's vLLM path (`rl_tiny.FakeVLLMGeneration`): per prompt, the world's gold
program, a plausible mutant, a crash and a syntax error. The viewer only ever reads the run folder,
and a random tiny policy writes syntax errors only, with no tool call to draw; scripted programs
give a run whose traces hold boxes, regions, failures and unequal rewards in every group.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from evaluate_helpers import ScriptedPolicy, _unit, all_gold
from rl_tiny import FakeVLLMGeneration, build_policy, build_world

REPO = Path(__file__).resolve().parents[1]


def variants(program: str) -> list[str]:
    """The bodies written for one prompt, after its `def execute_command(image) -> str:` line."""
    from vprl.data.shapes.mutations import mutate

    body = "\n" + program.split("\n", 1)[1]
    mutants = [m.program for m in mutate(program)]
    mutant = "\n" + mutants[0].split("\n", 1)[1] if mutants else body
    crash = body.replace("ImagePatch(image)", "ImagePatch(img)")  # NameError at run time
    broken = body.replace("(", "", 1)  # a syntax error
    return [body, mutant, crash, broken]


class ScriptedEngine(FakeVLLMGeneration):
    """Writes `variants` of each prompt's gold program, one per sample of its group."""

    gold: dict[str, str] = {}

    def generate(self, prompts, images, num_generations, profiler=None):
        self.calls += 1
        completions = []
        for i, prompt in enumerate(prompts):
            text = self.tokenizer.decode(prompt, skip_special_tokens=True)
            query = [line for line in text.split("\n") if line.startswith("# ")][-1][2:]
            bodies = variants(self.gold[query])
            completions.append(self.tokenizer(bodies[i % len(bodies)], add_special_tokens=False)["input_ids"])
        self.raw_lengths += [len(c) for c in completions]
        logprobs = [[[lp] for lp in self._logprobs(p, c)] for p, c in zip(prompts, completions, strict=True)]
        return prompts, completions, logprobs, [[[t] for t in c] for c in completions]


class AfterPolicy(ScriptedPolicy):
    """Wrong on a band of queries that partly overlaps the base policy's mistakes (those hashing
    below `wrong_share`): it fixes some questions and breaks others, as a real RL update does."""

    def mistaken(self, query: str) -> bool:
        return 0.55 <= _unit(query) < 0.8


def quickstart_run(root: Path) -> tuple[Path, Path, Path]:
    """(world, policy, run folder): two GRPO steps of the quickstart recipe on the tiny world."""
    import pytest
    import trl.trainer.grpo_trainer as grpo_trainer

    import vprl.train.recipe.checks
    from vprl.data.shapes import load_gold_programs
    from vprl.train.rl import main

    world = build_world(root / "world")
    policy = build_policy(root / "policy", world, fit_steps=1)  # the programs are scripted: no fitting needed
    ScriptedEngine.gold = load_gold_programs(world)["vqa"]
    run = root / "run"
    overrides = {
        "model_name_or_path": policy,
        "dataset_root": world,
        "output_dir": run,
        "max_steps": 2,
        "per_device_train_batch_size": 16,  # 4 prompts x 4 samples a step
        "num_generations": 4,
        "max_completion_length": 96,
        "report_to": "none",
        "save_steps": 100,
        "disable_tqdm": "true",
        "use_vllm": "true",
        "vllm_mode": "colocate",
        "vllm_importance_sampling_correction": "false",
    }
    argv = ["--config", str(REPO / "configs/quickstart.yaml")]
    for key, value in overrides.items():
        argv += [f"--{key}", str(value)]
    with pytest.MonkeyPatch.context() as mp, contextlib.chdir(REPO):
        mp.setattr(grpo_trainer, "VLLMGeneration", ScriptedEngine)
        mp.setattr(vprl.train.recipe.checks, "require_vllm", lambda key: None)  # vLLM itself is not installed here
        main(argv)
    return world, policy, run


def shapes_evaluation(root: Path, policy: Path, adapter: Path) -> Path:
    """An evaluation folder on a fresh world: the base policy against the adapter, both scripted
    (`AfterPolicy`); the world's referring expressions give grounding boxes."""
    from evaluate_helpers import build_world as build_eval_world

    from vprl.train.evaluation.pipeline import EvalConfig, evaluate

    world = root / "eval_world"
    build_eval_world(world, val=8)
    gold = all_gold(world)
    cfg = EvalConfig(
        model_name_or_path=str(policy),
        adapters=f"after_rl={adapter}",
        base_label="before_rl",
        shapes_root=str(world),
        prompt_layout="bare",
        out=str(root / "eval"),
        max_completion_length=32,
        threads=1,
    )
    evaluate(cfg, make_generator=lambda p: AfterPolicy(gold) if p.adapter else ScriptedPolicy(gold, wrong_share=0.7))
    return root / "eval"
