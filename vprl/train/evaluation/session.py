"""The live parts of an evaluation: the executor (started first), the policy, prompts per task.

One session serves every policy, mode, seed and dataset of a run: the executor and its tool
cache stay warm across them, and the base model is loaded once per policy with its adapter.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vprl.data.records import Example
from vprl.executor.backends import open_backend
from vprl.executor.host import ToolHost
from vprl.executor.runner import SyncRunner
from vprl.train.evaluation.fallback import fallback_program
from vprl.train.evaluation.memory import free_cuda_memory, gpu_totals, shutdown_engine, wait_for_free
from vprl.train.evaluation.metrics import Prediction
from vprl.train.evaluation.modes import EvalContext, ModeConfig, run_mode
from vprl.train.evaluation.plan import choose_generator, policy_args, prompt_template
from vprl.train.prompts import PreviousAttempt
from vprl.train.sampling.generator import Generator, policy_sampling
from vprl.train.sampling.hf import HFGenerator


class EvalSession:
    def __init__(self, cfg: Any):
        import torch

        self.cfg = cfg
        # `threads` is the evaluation's own: a caller that trains next in this process (the quickstart,
        # the benchmarks) gets its thread count back at close.
        self.threads_before = torch.get_num_threads()
        runner_cfg = cfg.runner_config()
        # The executor starts before any model is loaded (DESIGN: the sandbox parent holds no
        # model, token or CUDA state).
        self.host = ToolHost(open_backend(cfg.tool_stack, service=cfg.tool_service, **cfg.tool_overrides))
        self.runner = SyncRunner(self.host, runner_cfg)
        # Every tool model loads now, not inside the first program's call (whose timeout a cold
        # BLIP-2 would spend: every early simple_query an infra_error).
        self.host.preload()
        self.tuned_runner: SyncRunner | None = None
        self.judge = None
        self.generator: Generator | None = None
        try:
            if cfg.self_tuning is not None:
                overrides = {**cfg.tool_overrides, **cfg.self_tuning}
                tuned_host = ToolHost(open_backend(cfg.tool_stack, service=cfg.tool_service, **overrides))
                self.tuned_runner = SyncRunner(tuned_host, runner_cfg)
                tuned_host.preload()
            if cfg.unit_tests is not None:
                from vprl.train.evaluation.judge import build_judge

                self.judge = build_judge(cfg.unit_tests, self.runner)
        except BaseException:
            self.close()
            raise

    def prompt(self, example: Example, previous: PreviousAttempt | None = None) -> str:
        return prompt_template(self.cfg, example.task).build(example.query, previous=previous)

    def load_policy(self, policy: Any, make_generator: Callable[[Any], Generator] | None = None) -> None:
        """Load the base model with the policy's adapter (or let `make_generator` build the
        generator instead, for tests), once the previous policy's sampler has given its GPU memory back."""
        self.release_policy()
        if make_generator is not None:
            self.generator = make_generator(policy)
            return
        self.generator = policy_generator(self.cfg, policy)

    def release_policy(self) -> None:
        """Shut down the current policy's sampler and hand its GPU memory back to the driver: a vLLM
        engine keeps its share of the GPU until it is shut down, whoever still refers to it."""
        generator, self.generator = self.generator, None
        if generator is None:
            return
        had_engine = shutdown_engine(generator)
        del generator  # the last reference: what it held can be collected now
        free_cuda_memory(had_engine)

    def context(self, seed: int) -> EvalContext:
        if self.generator is None:
            raise RuntimeError("EvalSession: load_policy first")
        c = self.cfg
        return EvalContext(
            generator=self.generator,
            prompt=self.prompt,
            runner=self.runner,
            greedy=policy_sampling(temperature=0.0, max_new_tokens=c.max_completion_length, seed=seed),
            sampling=policy_sampling(
                temperature=c.temperature, top_p=c.top_p, max_new_tokens=c.max_completion_length, seed=seed
            ),
            judge=self.judge,
            tuned_runner=self.tuned_runner,
            fallback_program=fallback_program,
        )

    def predict(
        self,
        examples: Sequence[Example],
        mode: ModeConfig,
        seed: int,
        progress: Callable[[int], Any] | None = None,
    ) -> list[Prediction]:
        """Every example's prediction under `mode`, `cfg.chunk` questions at a time; `progress(n)`
        is called as each chunk's n questions are answered."""
        ctx = self.context(seed)
        preds: list[Prediction] = []
        # Tasks need their own prompt (signature, guidelines); keep dataset order in the output.
        for task in dict.fromkeys(e.task for e in examples):
            of_task = [e for e in examples if e.task == task]
            for start in range(0, len(of_task), self.cfg.chunk):
                chunk = of_task[start : start + self.cfg.chunk]
                preds += run_mode(ctx, chunk, mode)
                if progress is not None:
                    progress(len(chunk))
        order = {e.id: i for i, e in enumerate(examples)}
        return sorted(preds, key=lambda p: order[p.example_id])

    def tool_metrics(self) -> dict[str, Any]:
        return self.host.metrics()

    def close(self) -> None:
        if getattr(self, "generator", None) is not None:
            self.release_policy()
        for r in (self.tuned_runner, getattr(self, "runner", None)):
            if r is not None:
                r.close()
        import torch

        torch.set_num_threads(self.threads_before)

    def __enter__(self) -> EvalSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def policy_generator(cfg: Any, policy: Any) -> Generator:
    """The policy's sampler: vLLM's engine serving the adapter where vLLM can run (`choose_generator`),
    else transformers on the model loaded and placed like training places it."""
    from vprl.train.policy.loading import TOKENIZER_FILES, load_for_sampling

    args = policy_args(cfg)
    if choose_generator(cfg) == "vllm":
        from transformers import AutoTokenizer

        from vprl.train.sampling.vllm_engine import VLLMGenerator

        has_tokenizer = policy.adapter and any((Path(policy.adapter) / f).is_file() for f in TOKENIZER_FILES)
        tokenizer = AutoTokenizer.from_pretrained(policy.adapter if has_tokenizer else cfg.model_name_or_path)
        rank = json.loads((Path(policy.adapter) / "adapter_config.json").read_text())["r"] if policy.adapter else 16
        share = cfg.vllm_gpu_memory_utilization
        # vLLM refuses to start unless its share of the GPU is free: the previous engine must be gone.
        # (vLLM's CPU build takes its KV cache from VLLM_CPU_KVCACHE_SPACE instead of a share.)
        if gpus := gpu_totals():
            wait_for_free(share * gpus[0], f"policy {policy.label!r}'s vLLM engine")
        engine_kwargs = {
            "dtype": cfg.torch_dtype,
            "gpu_memory_utilization": share,
            **(cfg.vllm_kwargs or {}),
        }
        generator = VLLMGenerator(
            cfg.model_name_or_path, tokenizer, style=cfg.framing, max_lora_rank=rank, engine_kwargs=engine_kwargs
        )
        generator.set_adapter(policy.adapter)
        return generator
    import torch

    if cfg.threads:
        # Small models on a busy CPU run several times faster on one thread than oversubscribed.
        torch.set_num_threads(cfg.threads)
    model, tokenizer = load_for_sampling(args, policy.adapter)
    return HFGenerator(model, tokenizer, batch_size=cfg.batch_size, style=cfg.framing)
