"""Fault 1 of the GPU path (#24): GRPO with vLLM learned almost nothing from programs cut at a stop
sequence, and down-weighted every sequence when top_p < 1.

trl weights each sequence's loss by exp(sum of trainer log-probs - sum of vLLM log-probs). The EOS
appended to a stop-cut program carried a vLLM log-prob of 0, so its sequence was weighted by
p(EOS | program) (about 3e-4); vLLM's log-probs are renormalised over the nucleus and the trainer's are
not, so with top_p < 1 every sequence was weighted by its nucleus masses. These tests check the
training signal itself with a sampler that draws from the policy's own distribution
(`fake_vllm.PolicyVLLMGeneration`): every importance ratio is 1, and the gradient of the first step
equals the gradient of the same completions on the path without vLLM.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from fake_vllm import PolicyVLLMGeneration, vllm_filtered_logits
from rl_tiny import build_policy, build_world, write_recipe

from vprl.train.online.sampler_logprobs import SamplerFilters, kept_log_mass

TAIL = "\n# Is there a red circle?\ndef execute_command(image) -> str:\n    return 'no'\n"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_is")
    world = build_world(root / "world")
    return world, build_policy(root / "policy", world, fit_steps=80, tail=TAIL)


class GradCapture:
    """A trainer callback keeping each LoRA parameter's gradient at the first optimizer step."""

    def __init__(self):
        self.grads: dict[str, torch.Tensor] = {}

    def __getattr__(self, name):  # every other callback event does nothing
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if not self.grads:
            self.grads = {
                n: p.grad.detach().clone()
                for n, p in model.named_parameters()
                if p.requires_grad and p.grad is not None
            }


def _run(tmp_path, assets, monkeypatch, use_vllm: bool, replay: list | None = None, **values):
    """One GRPO step; returns (metrics row, captured gradients)."""
    import trl.trainer.grpo_trainer as grpo_trainer

    import vprl.train.online.run as online_run
    import vprl.train.recipe.checks
    from vprl.train.rl import main

    world, policy = assets
    capture = GradCapture()
    build = online_run.build_trainer

    def build_with_capture(*args, **kwargs):
        trainer, recorder = build(*args, **kwargs)
        trainer.add_callback(capture)
        return trainer, recorder

    monkeypatch.setattr(online_run, "build_trainer", build_with_capture)
    if use_vllm:
        monkeypatch.setattr(grpo_trainer, "VLLMGeneration", PolicyVLLMGeneration)
        monkeypatch.setattr(vprl.train.recipe.checks, "require_vllm", lambda key: None)  # vLLM is not installed here
    if replay is not None:  # the transformers path "samples" exactly what the vLLM run drew
        pending = list(replay)

        def replayed(self, prompt_ids, *args, **kwargs):
            batch = [pending.pop(0) for _ in prompt_ids]
            assert [p for p, _ in batch] == [list(p) for p in prompt_ids], "the two runs saw different prompts"
            return [c for _, c in batch], None

        monkeypatch.setattr(grpo_trainer.GRPOTrainer, "_generate_single_turn", replayed)
    out = tmp_path / ("vllm" if use_vllm else "transformers")
    recipe = write_recipe(
        tmp_path / f"{out.name}.yaml",
        model_name_or_path=str(policy),
        dataset_root=str(world),
        tool_stack="configs/tools/shapes.yaml",
        output_dir=str(out),
        warmup_steps=0,
        max_steps=1,
        per_device_train_batch_size=16,
        max_completion_length=40,
        max_grad_norm=1e9,  # compare raw gradients
        use_vllm=use_vllm,
        **({"vllm_mode": "colocate", "vllm_importance_sampling_correction": True} if use_vllm else {}),
        **values,
    )
    main(["--config", str(recipe)])
    (step,) = [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in m]
    return step, capture.grads


@pytest.mark.parametrize(
    "sampling",
    [
        pytest.param({"top_p": 1.0}, id="stop-cut"),
        pytest.param({"top_p": 0.7}, id="top_p"),
        pytest.param({"top_p": 0.8, "top_k": 12}, id="top_k_top_p"),
    ],
)
def test_vllm_importance_ratio_is_one_and_gradient_matches_the_transformers_path(
    tmp_path, assets, monkeypatch, sampling
):
    PolicyVLLMGeneration.instances.clear()
    vllm_step, vllm_grads = _run(tmp_path, assets, monkeypatch, use_vllm=True, temperature=1.0, **sampling)
    (engine,) = PolicyVLLMGeneration.instances
    # the batch holds both kinds of ending, so the test covers the stop-cut programs
    assert 0 < sum(engine.ended_at_stop) < len(engine.ended_at_stop)
    assert vllm_step["completions/clipped_ratio"] < 1.0
    for key in ("min", "mean", "max"):
        assert vllm_step[f"sampling/importance_sampling_ratio/{key}"] == pytest.approx(1.0, abs=2e-4), vllm_step
    assert vllm_step["sampling/sampling_logp_difference/max"] < 1e-4

    with monkeypatch.context() as patch:
        replay = list(zip(engine.prompts, engine.completion_ids, strict=True))
        hf_step, hf_grads = _run(tmp_path, assets, patch, use_vllm=False, replay=replay, temperature=1.0, **sampling)
    assert hf_step["completions/clipped_ratio"] == vllm_step["completions/clipped_ratio"]
    assert vllm_grads.keys() == hf_grads.keys() and vllm_grads
    for name, grad in hf_grads.items():
        torch.testing.assert_close(vllm_grads[name], grad, rtol=1e-3, atol=1e-7, msg=name)
    assert math.isfinite(vllm_step["grad_norm"]) and vllm_step["grad_norm"] > 1e-3


@pytest.mark.parametrize(
    "filters",
    [
        SamplerFilters(temperature=1.0, top_p=0.9),
        SamplerFilters(temperature=0.7, top_k=5),
        SamplerFilters(temperature=1.3, top_k=40, top_p=0.5),
        SamplerFilters(temperature=1.0, min_p=0.05, top_p=0.95),
    ],
    ids=str,
)
def test_kept_mass_turns_vllm_processed_logprobs_into_the_trainers(filters):
    """vLLM's processed log-prob of a kept token plus `kept_log_mass` is the temperature-scaled
    log-prob the trainer computes."""
    logits = torch.randn(6, 64, generator=torch.Generator().manual_seed(0)) * 3
    mass = kept_log_mass(logits, filters)
    for row in range(logits.size(0)):
        processed = vllm_filtered_logits(
            logits[row], filters.temperature, filters.top_k, filters.top_p, filters.min_p
        ).log_softmax(-1)
        trainer = (logits[row] / filters.temperature).log_softmax(-1)
        kept = processed.isfinite()
        assert 0 < kept.sum() < logits.size(1)
        torch.testing.assert_close(processed[kept] + mass[row], trainer[kept], rtol=0, atol=1e-5)


def test_repetition_penalty_with_the_correction_is_refused():
    from vprl.train.online.sampler_logprobs import check_correctable

    class Trainer:
        repetition_penalty = 1.1

    with pytest.raises(ValueError, match="repetition_penalty 1.1"):
        check_correctable(Trainer())
