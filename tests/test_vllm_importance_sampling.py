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

import inspect
import json
import math
from contextlib import nullcontext

import pytest
import torch
from fake_vllm import PolicyVLLMGeneration, vllm_filtered_logits
from rl_tiny import build_policy, build_world, write_recipe

from vprl.train.online import sampler_logprobs
from vprl.train.online.sampler_logprobs import HeadTransform, KeptMassProbe, SamplerFilters, kept_log_mass

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
    """One GRPO step; returns (metrics row, captured gradients, rows of each batched forward)."""
    import trl.trainer.grpo_trainer as grpo_trainer

    import vprl.train.online.run as online_run
    import vprl.train.recipe.checks
    from vprl.train.rl import main

    world, policy = assets
    capture, forwards = GradCapture(), []
    build = online_run.build_trainer

    def build_with_capture(*args, **kwargs):
        trainer, recorder = build(*args, **kwargs)
        trainer.add_callback(capture)
        # the batch's forwards (the sampler's are one row each): trl's old-log-prob pass and the loss
        backbone = trainer.model.get_base_model().base_model
        backbone.register_forward_hook(
            lambda m, args, kw, out: forwards.append(kw["input_ids"].size(0)), with_kwargs=True
        )
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
        tool_stack="shapes",
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
    return step, capture.grads, [rows for rows in forwards if rows > 1]


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
    vllm_step, vllm_grads, forwards = _run(tmp_path, assets, monkeypatch, use_vllm=True, temperature=1.0, **sampling)
    # #34 item 1: the top-k/top-p correction rides on trl's old-log-prob forward, adds none of its own
    assert forwards == [16, 16], forwards
    (engine,) = PolicyVLLMGeneration.instances
    # the batch holds both kinds of ending, so the test covers the stop-cut programs
    assert 0 < sum(engine.ended_at_stop) < len(engine.ended_at_stop)
    assert vllm_step["completions/clipped_ratio"] < 1.0
    for key in ("min", "mean", "max"):
        assert vllm_step[f"sampling/importance_sampling_ratio/{key}"] == pytest.approx(1.0, abs=2e-4), vllm_step
    assert vllm_step["sampling/sampling_logp_difference/max"] < 1e-4

    with monkeypatch.context() as patch:
        replay = list(zip(engine.prompts, engine.completion_ids, strict=True))
        hf_step, hf_grads, _ = _run(
            tmp_path, assets, patch, use_vllm=False, replay=replay, temperature=1.0, **sampling
        )
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


FILTER_COMBOS = [
    SamplerFilters(temperature=1.0, top_p=0.9),
    SamplerFilters(temperature=0.7, top_k=5),
    SamplerFilters(temperature=1.3, top_k=40, top_p=0.5),
    SamplerFilters(temperature=1.0, min_p=0.05, top_p=0.95),
    SamplerFilters(temperature=1.0, min_p=0.02, top_k=3, top_p=0.6),
]


@pytest.mark.parametrize("filters", FILTER_COMBOS, ids=str)
@pytest.mark.parametrize("transform", [HeadTransform(), HeadTransform(scale=0.5, softcap=4.0)], ids=str)
def test_item1_kept_mass_a_slice_at_a_time_equals_the_full_sort(monkeypatch, filters, transform):
    """#34 item 1: the correction projects and filters a few positions at a time instead of sorting
    the whole batch's logits; every position's kept mass is the one the full-tensor computation
    gives, ties included (tied head rows give tied logits, at the top-k and top-p boundaries)."""
    gen = torch.Generator().manual_seed(1)
    vocab, width = 200, 16
    head = torch.nn.Linear(width, vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, width, generator=gen))
        head.weight[100:160] = head.weight[40:100]  # 60 tokens tied two by two
        head.weight[160:] = head.weight[0]  # and 40 tied with token 0
    hidden = torch.randn(37, width, generator=gen) * 0.6
    full = kept_log_mass(transform(head(hidden)), filters)
    assert full.isfinite().all() and (full < 0).any()
    monkeypatch.setattr(sampler_logprobs, "SLICE_BYTES", 5 * sampler_logprobs.BYTES_PER_ELEMENT * vocab)
    assert sampler_logprobs.slice_positions(vocab) == 5  # 8 slices, the last one short
    sliced = sampler_logprobs.sliced_kept_log_mass(hidden, head, filters, transform, vocab)
    torch.testing.assert_close(sliced, full, rtol=0, atol=1e-6)


def _tiny_causal_lm(softcap: float | None = None):
    """A 2-layer Llama with a 300-token vocabulary; with `softcap`, a Gemma 2, whose forward soft-caps."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    sizes = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    if softcap is None:
        return LlamaForCausalLM(LlamaConfig(**sizes, pad_token_id=0, tie_word_embeddings=False)).eval()
    config = Gemma2Config(**sizes, num_key_value_heads=2, head_dim=8, final_logit_softcapping=softcap, pad_token_id=0)
    return Gemma2ForCausalLM(config).eval()


@pytest.mark.parametrize("filters", FILTER_COMBOS[:3], ids=str)
def test_item1_kept_mass_from_trls_own_old_logprob_pass(filters):
    """#34 item 1: `KeptMassProbe` takes the hidden states of trl's old-log-probability forward (its
    fused LM head, chunked by rows as trl chunks it) and gives, at every completion position, what
    the old second forward gave: `kept_log_mass` of the model's own logits; 0 where the attention
    mask leaves the position out. trl's log-probabilities are untouched and one forward per chunk
    is all that runs."""
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    model = _tiny_causal_lm()
    reference = _tiny_causal_lm()
    add_fused_lm_head(model, temperature=filters.temperature)
    gen = torch.Generator().manual_seed(2)
    rows, prompt, width = 5, 6, 9
    ids = torch.randint(1, 300, (rows, prompt + width), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a shorter prompt, left-padded
    mask[1, prompt + 4 :] = 0  # shorter completions, right-padded
    mask[3, prompt + 7 :] = 0
    calls = []
    model.model.register_forward_hook(lambda *a: calls.append(1))

    trl_pass = inspect.unwrap(GRPOTrainer._get_per_token_logps_and_entropies)  # without trl's profiler

    class Host:  # what trl's log-probability pass reads from its trainer
        class accelerator:  # noqa: N801
            autocast = staticmethod(nullcontext)

    with torch.no_grad(), KeptMassProbe(model, filters, width) as probe:
        logps, _, _ = trl_pass(Host(), model, ids, mask, width, batch_size=2)
    mass = probe.mass()
    assert len(calls) == 3 and mass.shape == (rows, width)
    with torch.no_grad():
        logits = reference(input_ids=ids, attention_mask=mask).logits[:, -width - 1 : -1]
        expected_logps = (logits / filters.temperature).log_softmax(-1).gather(-1, ids[:, -width:, None])[..., 0]
    expected = kept_log_mass(logits, filters)
    valid = mask[:, -width:].bool()
    torch.testing.assert_close(mass[valid], expected[valid], rtol=0, atol=1e-5)
    assert (mass[~valid] == 0).all() and (mass[valid] < 0).any()
    torch.testing.assert_close(logps[valid], expected_logps[valid], rtol=0, atol=1e-5)


def test_item1_kept_mass_sees_the_heads_soft_cap():
    """#34 item 1, a model that soft-caps its logits (Gemma 2): the kept mass is taken after the cap,
    as the model's own logits (which vLLM samples from) are."""
    from trl.trainer.utils import add_fused_lm_head

    filters = SamplerFilters(temperature=1.0, top_p=0.8)
    model, reference = _tiny_causal_lm(softcap=0.5), _tiny_causal_lm(softcap=0.5)
    add_fused_lm_head(model)
    ids = torch.randint(1, 300, (2, 10), generator=torch.Generator().manual_seed(3))
    labels = ids.clone()
    labels[:, :-4] = -100
    with torch.no_grad(), KeptMassProbe(model, filters, 4) as probe:
        model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, fused_lm_head=True)
        logits = reference(input_ids=ids).logits[:, -5:-1]
    torch.testing.assert_close(probe.mass(), kept_log_mass(logits, filters), rtol=0, atol=1e-5)
