"""The `rest` algorithm of the entry point: the recipe mapped onto `train.rest.run_rest`.

The loop itself (sample, score, keep, SFT, repeat; one adapter per iteration; resume by skipping
finished iterations) lives in `train.rest`. Here: the recipe's `rest_*` keys and trainer arguments
become a `RestConfig` and a `SamplingConfig`, the generator is built (transformers, or vLLM's
offline engine serving the current adapter), and the last iteration's adapter is copied to
`<output_dir>/adapter` with the tokenizer.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from executor.runner import SyncRunner
from rewards.compose import RewardComposer
from train import runs
from train.generation import HFGenerator, SamplingConfig
from train.policy import load_model, load_tokenizer, policy_name, wrap_with_lora
from train.rl_config import RLConfig
from train.rl_data import PromptedExample
from train.rollouts import RolloutLog
from train.scoring import ProgramScorer

# SFTConfig fields the ReST loop sets itself, or takes from RestConfig's own fields.
_OWNED = {
    "output_dir",
    "num_train_epochs",
    "completion_only_loss",
    "max_length",
    "use_cpu",
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "max_grad_norm",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "gradient_checkpointing",
    "seed",
    "save_steps",
}


def rest_config(cfg: RLConfig) -> Any:
    from train.rest import RestConfig

    t, r = cfg.training, cfg.rest
    # What the recipe changed from the defaults (compared after both went through __post_init__),
    # plus where to report, which the ReST loop would otherwise turn off.
    base = type(t)(output_dir=t.output_dir).to_dict()
    overrides = {
        k: v
        for k, v in t.to_dict().items()
        if k not in _OWNED and (v != base.get(k) or k == "report_to") and not k.endswith("_token") and _plain(v)
    }
    warmup = t.warmup_steps if t.warmup_steps < 1 else 0.0
    return RestConfig(
        iterations=r.rest_iterations,
        samples_per_query=r.rest_samples_per_query,
        keep_threshold=r.rest_keep_threshold,
        keep_rule=r.rest_keep_rule,
        dedupe=r.rest_dedupe,
        max_kept_per_query=r.rest_max_kept_per_query,
        restart_from_base=r.rest_restart_from_base,
        style=cfg.policy.framing,
        learning_rate=t.learning_rate,
        lr_scheduler_type=str(getattr(t.lr_scheduler_type, "value", t.lr_scheduler_type)),
        warmup_ratio=warmup,
        max_grad_norm=t.max_grad_norm,
        epochs=t.num_train_epochs,
        batch_size=t.per_device_train_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        gradient_checkpointing=t.gradient_checkpointing,
        max_length=t.max_length or 4096,
        seed=t.seed,
        sft_overrides=overrides,
    )


def _plain(value: Any) -> bool:
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return value is None or isinstance(value, bool | int | float | str)


def build_generator(cfg: RLConfig, model: Any, tokenizer: Any) -> Any:
    if cfg.rest.rest_generator == "vllm":
        from train.vllm_generation import VLLMGenerator

        return VLLMGenerator(
            model_path=cfg.policy.model_name_or_path,
            tokenizer=tokenizer,
            style=cfg.policy.framing,
            max_lora_rank=cfg.policy.lora_r,
            engine_kwargs=dict(cfg.rest.rest_vllm_kwargs),
        )
    return HFGenerator(model, tokenizer, batch_size=cfg.rest.rest_generation_batch_size, style=cfg.policy.framing)


def train_rest(
    cfg: RLConfig,
    prompted: list[PromptedExample],
    composer: RewardComposer,
    runner: SyncRunner,
    run_dir: Path,
    hashes: dict[str, str],
) -> Path:
    from train.rest import ITERATIONS_DIR, run_rest
    from train.rest_sft import sft_state

    config = rest_config(cfg)
    # Under several processes only the main one samples (and so builds a generator: a vLLM engine
    # is one per run) and writes files; every process trains.
    state = sft_state(config, run_dir / ITERATIONS_DIR)
    tokenizer = load_tokenizer(cfg.policy)
    model, peft_config = load_model(cfg.policy)
    model = wrap_with_lora(model, peft_config)
    sampling = SamplingConfig(
        temperature=cfg.rest.rest_temperature,
        top_p=cfg.rest.rest_top_p,
        max_new_tokens=cfg.rest.rest_max_new_tokens,
        seed=cfg.training.seed,
    )
    adapters = run_rest(
        model=model,
        tokenizer=tokenizer,
        items=[(p.example, p.prompt) for p in prompted],
        scorer=ProgramScorer(runner, composer),
        generator=build_generator(cfg, model, tokenizer) if state.is_main_process else None,
        config=config,
        sampling=sampling,
        run_dir=run_dir,
        log=RolloutLog.in_run(run_dir),
        prompt_hash=next(iter(hashes.values())),
        policy_name=policy_name(cfg.policy),
    )
    out = run_dir / runs.ADAPTER_DIR
    if state.is_main_process:
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(adapters[-1], out)
        tokenizer.save_pretrained(str(out))
    state.wait_for_everyone()
    return out
