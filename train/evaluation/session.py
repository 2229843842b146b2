"""The live parts of an evaluation: the executor (started first), the policy, prompts per task.

One session serves every policy, mode, seed and dataset of a run: the executor and its tool
cache stay warm across them, and the base model is loaded once per policy with its adapter.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from data.records import Example
from executor.host import ToolHost
from executor.runner import RunnerConfig, SyncRunner
from executor.tools.stack import build_backend
from train.evaluation.fallback import fallback_program
from train.evaluation.metrics import Prediction
from train.evaluation.modes import EvalContext, ModeConfig, run_mode
from train.prompts import PreviousAttempt, PromptConfig, PromptTemplate
from train.sampling.generator import Generator, policy_sampling
from train.sampling.hf import HFGenerator

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@lru_cache(maxsize=64)
def _template(variant: str, task: str, layout: str, ice_file: str | None, max_ices: int | None) -> PromptTemplate:
    return PromptTemplate.from_config(
        PromptConfig(variant=variant, task=task, layout=layout, ice_file=ice_file, max_ices=max_ices)
    )


def prompt_template(cfg: Any, task: str) -> PromptTemplate:
    """The prompt template of a task under an `EvalConfig` (rendered once per setting)."""
    return _template(cfg.variant, task, cfg.layout, cfg.ice_file, cfg.max_ices)


class EvalSession:
    def __init__(self, cfg: Any):
        self.cfg = cfg
        runner_cfg = RunnerConfig(slots=cfg.slots, timeout_s=cfg.timeout_s, sandbox=cfg.sandbox)
        # The executor starts before any model is loaded (DESIGN: the sandbox parent holds no
        # model, token or CUDA state).
        self.host = ToolHost(build_backend(cfg.tools))
        self.runner = SyncRunner(self.host, runner_cfg)
        self.tuned_runner: SyncRunner | None = None
        self.judge = None
        self.generator: Generator | None = None
        try:
            if cfg.self_tuning:
                overrides = json.loads(cfg.self_tuning)
                self.tuned_runner = SyncRunner(ToolHost(build_backend(cfg.tools, **overrides)), runner_cfg)
            if cfg.unit_tests:
                from train.evaluation.judge import build_judge

                self.judge = build_judge(json.loads(cfg.unit_tests), self.runner)
        except BaseException:
            self.close()
            raise

    def prompt(self, example: Example, previous: PreviousAttempt | None = None) -> str:
        return prompt_template(self.cfg, example.task).build(example.query, previous=previous)

    def load_policy(self, policy: Any, make_generator: Callable[[Any], Generator] | None = None) -> None:
        """Load the base model with the policy's adapter (or let `make_generator` build the
        generator instead, for tests)."""
        self.generator = None  # free the previous policy before loading the next
        if make_generator is not None:
            self.generator = make_generator(policy)
            return
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.cfg.threads:
            # Small models on a busy CPU run several times faster on one thread than oversubscribed.
            torch.set_num_threads(self.cfg.threads)

        model = AutoModelForCausalLM.from_pretrained(self.cfg.policy)
        if policy.adapter:
            from peft import PeftModel

            # Merged into the base weights: the same function, without LoRA's extra matmuls per layer.
            model = PeftModel.from_pretrained(model, policy.adapter).merge_and_unload()
        model.eval()
        # A policy saved from training may carry use_cache=False (gradient checkpointing); decoding
        # without the KV cache is an order of magnitude slower, and nothing here trains.
        model.config.use_cache = True
        model.generation_config.use_cache = True
        # An adapter folder may carry the tokenizer it was trained with (added tokens); else the base's.
        has_tokenizer = policy.adapter and any((Path(policy.adapter) / f).is_file() for f in TOKENIZER_FILES)
        tokenizer = AutoTokenizer.from_pretrained(policy.adapter if has_tokenizer else self.cfg.policy)
        self.generator = HFGenerator(model, tokenizer, batch_size=self.cfg.batch_size)

    def context(self, seed: int) -> EvalContext:
        if self.generator is None:
            raise RuntimeError("EvalSession: load_policy first")
        c = self.cfg
        return EvalContext(
            generator=self.generator,
            prompt=self.prompt,
            runner=self.runner,
            greedy=policy_sampling(temperature=0.0, max_new_tokens=c.max_new_tokens, seed=seed),
            sampling=policy_sampling(
                temperature=c.temperature, top_p=c.top_p, max_new_tokens=c.max_new_tokens, seed=seed
            ),
            judge=self.judge,
            tuned_runner=self.tuned_runner,
            fallback_program=fallback_program,
        )

    def predict(self, examples: Sequence[Example], mode: ModeConfig, seed: int) -> list[Prediction]:
        ctx = self.context(seed)
        preds: list[Prediction] = []
        # Tasks need their own prompt (signature, guidelines); keep dataset order in the output.
        for task in dict.fromkeys(e.task for e in examples):
            preds += run_mode(ctx, [e for e in examples if e.task == task], mode)
        order = {e.id: i for i, e in enumerate(examples)}
        return sorted(preds, key=lambda p: order[p.example_id])

    def tool_metrics(self) -> dict[str, Any]:
        return self.host.metrics()

    def close(self) -> None:
        for r in (self.tuned_runner, getattr(self, "runner", None)):
            if r is not None:
                r.close()

    def __enter__(self) -> EvalSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
