"""vLLM weight syncs of a bf16 LoRA policy: trl's `VLLMGeneration.sync_weights`, run for real on a
stand-in engine that records what it is given, with and without `drift_free_sync`."""

from __future__ import annotations

import types

import pytest
import torch

peft = pytest.importorskip("peft")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from trl.distributed import DistributedBackend  # noqa: E402
from trl.generation.vllm_generation import VLLMGeneration  # noqa: E402

from vprl.train.online.weight_sync import drift_free_sync, unsupported_reason  # noqa: E402

SYNCS = 50


class RecordingEngine:
    """What trl's colocate path calls on `llm`: the weights it loads and the cache resets."""

    def __init__(self) -> None:
        self.loaded: dict[str, torch.Tensor] = {}
        model = types.SimpleNamespace(load_weights=self._load)
        runner = types.SimpleNamespace(model=model)
        worker = types.SimpleNamespace(model_runner=runner)
        self.llm_engine = types.SimpleNamespace(model_executor=types.SimpleNamespace(driver_worker=worker))

    def _load(self, weights) -> None:
        for name, tensor in weights:
            self.loaded[name] = tensor.detach().clone()

    def reset_prefix_cache(self) -> None:
        pass


def _accelerator(zero_stage: int = 0, fsdp_version: int | None = None):
    plugin = types.SimpleNamespace(zero_stage=zero_stage) if zero_stage else None
    fsdp = types.SimpleNamespace(fsdp_version=fsdp_version) if fsdp_version else None
    return types.SimpleNamespace(state=types.SimpleNamespace(deepspeed_plugin=plugin, fsdp_plugin=fsdp))


def _generation(model, accelerator=None) -> VLLMGeneration:
    """trl's class as the trainer holds it, without `_init_vllm` (no vLLM here)."""
    gen = VLLMGeneration.__new__(VLLMGeneration)
    gen.model = model
    gen.accelerator = accelerator or _accelerator()
    gen._dist = DistributedBackend(gen.accelerator)
    gen.mode = "colocate"
    gen.enable_sleep_mode = False
    gen._weight_metadata = None
    gen.llm = RecordingEngine()
    return gen


def _policy(seed: int = 0, dtype=torch.bfloat16, attention_bias: bool = False, **lora):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attention_bias=attention_bias,
    )
    base = LlamaForCausalLM(config).to(dtype)
    settings = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], **lora}
    model = peft.get_peft_model(base, peft.LoraConfig(**settings))
    with torch.no_grad():  # B starts at zero; a trained adapter does not
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    return model


def _train_a_little(model, step: int) -> None:
    """What changes between two syncs in training: the adapter, by an optimizer-sized step."""
    gen = torch.Generator().manual_seed(1000 + step)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.add_(torch.randn(param.shape, generator=gen, dtype=torch.float32).to(param.dtype) * 2e-3)


def _base_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def _sync_many(gen, model, syncs: int = SYNCS) -> None:
    for step in range(syncs):
        _train_a_little(model, step)
        gen.sync_weights()


def _reference_merged(model) -> dict[str, torch.Tensor]:
    """The merged weights computed by peft itself on a float32 copy, rounded once to bf16."""
    import copy

    fp32 = copy.deepcopy(model).to(torch.float32)
    fp32.merge_adapter()
    out = {}
    for name, param in fp32.named_parameters():
        vllm_name = name.removeprefix("base_model.model.").replace(".base_layer", "")
        if "lora_" not in vllm_name:
            out[vllm_name] = param.detach().to(torch.bfloat16)
    return out


def test_trl_merge_unmerge_drifts_bf16_base_weights_in_50_syncs():
    """The fault itself, on trl's code as shipped: this is what `drift_free_sync` removes."""
    model = _policy()
    before = _base_weights(model)
    _sync_many(_generation(model), model)
    changed = [n for n, w in _base_weights(model).items() if not torch.equal(w, before[n])]
    assert any("q_proj.base_layer.weight" in n for n in changed)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_lora_merge_drift_base_weights_bit_identical_after_50_syncs(dtype):
    model = _policy(dtype=dtype)
    gen = _generation(model)
    assert drift_free_sync(gen) is True
    before = _base_weights(model)
    _sync_many(gen, model)
    after = _base_weights(model)
    assert all(torch.equal(after[n], before[n]) for n in before)
    assert not any(m.merged for m in model.modules() if hasattr(m, "merged_adapters"))


def test_drift_free_sync_yields_the_merged_weights_within_bf16_rounding():
    model = _policy()
    gen = _generation(model)
    drift_free_sync(gen)
    _sync_many(gen, model, syncs=3)
    want = _reference_merged(model)
    got = gen.llm.loaded
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].dtype == torch.bfloat16
        # one bf16 rounding of the exact sum: at most one unit in the last place apart
        torch.testing.assert_close(got[name], tensor, rtol=2**-7, atol=1e-30, msg=name)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(
        got[q], _base_weights(model)[f"base_model.model.{q.replace('.weight', '.base_layer.weight')}"]
    )


def test_drift_free_sync_streams_the_names_trl_streams():
    model = _policy()
    trl_gen = _generation(model)
    ours = _generation(model)
    drift_free_sync(ours)
    trl_names = [name for name, _ in trl_gen._iter_named_params()]
    assert [name for name, _ in ours._iter_named_params()] == trl_names
    assert "model.layers.1.self_attn.o_proj.weight" in trl_names and not any("lora" in n for n in trl_names)


@pytest.mark.parametrize(
    "case, expected",
    [
        ("fsdp", "FSDP"),
        ("zero3", "ZeRO-3"),
        ("dora", "variant"),
        ("lora_bias", "LoRA bias"),
        ("plain_model", "not a PEFT model"),
    ],
)
def test_drift_free_sync_defers_to_trl_where_it_does_not_apply(case, expected):
    accelerator = None
    lora: dict = {}
    if case == "fsdp":
        accelerator = _accelerator(fsdp_version=2)
    elif case == "zero3":
        accelerator = _accelerator(zero_stage=3)
    elif case == "dora":
        lora = {"use_dora": True}
    elif case == "lora_bias":
        lora = {"lora_bias": True, "attention_bias": True}
    model = _policy(**lora)
    if case == "plain_model":
        model = model.get_base_model()
    gen = _generation(model, accelerator)
    original = gen._iter_named_params
    assert expected in unsupported_reason(gen)
    assert drift_free_sync(gen) is False
    assert gen._iter_named_params == original
