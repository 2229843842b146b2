"""hf backend: bitsandbytes 8-bit/4-bit loading (works on CPU) and the vLLM engine (GPU + vllm only)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

pytest.importorskip("transformers")

import tiny_models as tiny

from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.hf import HFBackend
from vprl.executor.tools.hf.llm import vllm_available
from vprl.executor.tools.images import ImageStore


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_tiny_quant")
    return {family: tiny.build(family, root) for family in ("causal_lm", "blip2_t5")}


@pytest.mark.parametrize(("quantization", "layer"), [("8bit", "Linear8bitLt"), ("4bit", "Linear4bit")])
def test_llm_loads_quantized_and_generates(paths, quantization, layer):
    pytest.importorskip("bitsandbytes")
    backend = HFBackend(
        ImageStore(), device="cpu", llm={"model": paths["causal_lm"], "max_new_tokens": 3}, quantization=quantization
    )
    replies = backend.run(
        "llm",
        [ToolCall("llm", None, None, {"prompt": "what is a cat?"}), ToolCall("llm", None, None, {"prompt": "hi"})],
    )
    assert all(isinstance(r, str) for r in replies)
    (key,) = backend.models.loaded()
    model = backend.models._loaded[key].model
    assert type(model.model.layers[0].self_attn.q_proj).__name__ == layer


def test_blip2_loads_in_8bit_as_in_viunit(paths):
    pytest.importorskip("bitsandbytes")
    images = ImageStore()
    ref = images.add_array(np.full((40, 60, 3), 128, dtype=np.uint8)).ref
    backend = HFBackend(
        images, device="cpu", vqa={"model": paths["blip2_t5"], "quantization": "8bit", "max_length": 3}
    )
    (answer,) = backend.run("vqa", [ToolCall("vqa", ref, None, {"question": "what is this?"})])
    assert isinstance(answer, str)
    (key,) = backend.models.loaded()
    linear_types = {type(m).__name__ for m in backend.models._loaded[key].model.modules()}
    assert "Linear8bitLt" in linear_types


@pytest.mark.gpu
@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason="vllm is not installed")
def test_llm_through_vllm(paths):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("vLLM needs a CUDA device")
    backend = HFBackend(
        ImageStore(), device="cuda", llm={"model": paths["causal_lm"], "engine": "vllm", "max_new_tokens": 4}
    )
    replies = backend.run(
        "llm",
        [ToolCall("llm", None, None, {"prompt": "what is a cat?"}), ToolCall("llm", None, None, {"prompt": "hi"})],
    )
    assert len(replies) == 2 and all(isinstance(r, str) for r in replies)
