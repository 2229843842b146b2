"""The `rest` algorithm of `vprl/train/rl.py`: the recipe's policy, `RestArgs` and `SFTArgs` handed to
`vprl.train.rest.loop.run_rest`, the generator built (transformers, or vLLM's offline engine serving the
current adapter), and the last iteration's adapter copied to `<output_dir>/adapter` with the
tokenizer."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from vprl.executor.runner import SyncRunner
from vprl.rewards.compose import RewardComposer
from vprl.train.policy.loading import load_model, load_tokenizer, policy_name, wrap_with_lora
from vprl.train.recipe.data import PromptedExample
from vprl.train.recipe.rl_config import RLConfig
from vprl.train.rest.iterations import ITERATIONS_DIR
from vprl.train.rest.loop import run_rest
from vprl.train.rest.ranks import gather_timeout_s
from vprl.train.rest.sft import sft_state
from vprl.train.rollouts.log import RolloutLog
from vprl.train.rollouts.scorer import ProgramScorer
from vprl.train.runs.folder import ADAPTER_DIR
from vprl.train.sampling.hf import HFGenerator


def build_generator(cfg: RLConfig, model: Any, tokenizer: Any, processes: int = 1) -> Any:
    """This process's sampler. Under several processes each one runs its own vLLM engine on its own
    GPU, as trl's colocate mode does: vLLM's external launcher makes the engine join the processes
    `accelerate launch` started (RANK, LOCAL_RANK, WORLD_SIZE) instead of taking GPU 0 with a world
    of its own."""
    if cfg.rest.rest_generator == "vllm":
        from vprl.train.sampling.vllm_engine import VLLMGenerator

        engine_kwargs = dict(cfg.rest.rest_vllm_kwargs or {})
        if processes > 1:
            engine_kwargs.setdefault("distributed_executor_backend", "external_launcher")
        return VLLMGenerator(
            model_path=cfg.policy.model_name_or_path,
            tokenizer=tokenizer,
            style=cfg.policy.framing,
            max_lora_rank=cfg.policy.lora_r,
            engine_kwargs=engine_kwargs,
        )
    return HFGenerator(model, tokenizer, batch_size=cfg.rest.generation_batch_size, style=cfg.policy.framing)


def train_rest(
    cfg: RLConfig,
    prompted: list[PromptedExample],
    composer: RewardComposer,
    runner: SyncRunner,
    run_dir: Path,
    hashes: dict[str, str],
) -> Path:
    # Under several processes each one samples and scores its shard of the questions and trains;
    # the main one alone writes files.
    state = sft_state(cfg.training, run_dir / ITERATIONS_DIR)
    tokenizer = load_tokenizer(cfg.policy)
    model, peft_config = load_model(cfg.policy)
    model = wrap_with_lora(model, peft_config)
    adapters = run_rest(
        model=model,
        tokenizer=tokenizer,
        items=[(p.example, p.prompt) for p in prompted],
        scorer=ProgramScorer(runner, composer),
        generator=build_generator(cfg, model, tokenizer, state.num_processes),
        rest=cfg.rest,
        sampling=cfg.sampling,
        sft=cfg.training,
        style=cfg.policy.framing,
        run_dir=run_dir,
        log=RolloutLog.in_run(run_dir),
        prompt_hash=next(iter(hashes.values())),
        policy_name=policy_name(cfg.policy),
        gather_timeout_s=gather_timeout_s(
            cfg.training.ddp_timeout, len(prompted), state.num_processes, cfg.sampling.num_generations, runner
        ),
        repair=cfg.repair.config() if cfg.repair.enabled else None,
    )
    out = run_dir / ADAPTER_DIR
    if state.is_main_process:
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(adapters[-1], out)
        tokenizer.save_pretrained(str(out))
    state.wait_for_everyone()
    return out
