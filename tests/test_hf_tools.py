"""hf backend end to end on tiny random checkpoints: config validation, lazy loading, every family
through `HFBackend.run`, batching and deduplication."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

pytest.importorskip("transformers")

import tiny_models as tiny

from vprl.data.boxes import box_to_top_left
from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.errors import ToolUnavailable
from vprl.executor.tools.hf import HFBackend
from vprl.executor.tools.images import ImageStore

H, W = 100, 200  # the size of the `store` fixture (tests/conftest.py)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_tiny")
    return {family: tiny.build(family, root) for family in tiny.BUILDERS}


def full_config(paths, detector="grounding_dino", matcher="clip", captioner="blip2", depth="dpt"):
    return {
        "device": "cpu",
        "dtype": "float32",
        "detect": {"model": paths[detector]},
        "verify": {"model": paths[matcher]},
        "itm": {"model": paths[matcher]},
        "vqa": {"model": paths[captioner]},
        "caption": {"model": paths[captioner], "max_length": 6},
        "depth": {"model": paths[depth]},
        "llm": {"model": paths["causal_lm"], "max_new_tokens": 4},
    }


def test_unknown_keys_are_errors_listing_valid_ones(paths, store):
    images, _ = store
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['detector'\].*valid keys: \['device'"):
        HFBackend(images, detector={"model": paths["owlv2"]})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['box_thresh'\] under `detect`.*box_threshold"):
        HFBackend(images, detect={"model": paths["owlv2"], "box_thresh": 0.3})
    with pytest.raises(ValueError, match="detect.model` is required"):
        HFBackend(images, detect={"box_threshold": 0.3})
    with pytest.raises(ValueError, match="dtype must be one of"):
        HFBackend(images, dtype="float64", itm={"model": paths["clip"]})
    with pytest.raises(ValueError, match="quantization must be one of"):
        HFBackend(images, itm={"model": paths["clip"], "quantization": "3bit"})


def test_only_configured_tools_are_supported_and_models_load_lazily(paths, store):
    images, ref = store
    backend = HFBackend(images, device="cpu", verify={"model": paths["clip"]}, itm={"model": paths["clip"]})
    assert backend.supports("itm") and backend.supports("verify") and not backend.supports("depth")
    assert backend.models.loaded() == []
    with pytest.raises(ToolUnavailable, match="no 'depth' tool"):
        backend.run("depth", [ToolCall("depth", ref, None, {})])
    backend.run("itm", [ToolCall("itm", ref, None, {"texts": ["a cat"]})])
    backend.run("verify", [ToolCall("verify", ref, None, {"object_name": "cat", "property": "red"})])
    assert len(backend.models.loaded()) == 1  # verify and itm share one CLIP


def test_family_mismatch_is_a_clear_error(paths, store):
    images, ref = store
    backend = HFBackend(images, device="cpu", detect={"model": paths["clip"]})
    with pytest.raises(ToolUnavailable, match="is a 'clip' model; supported families"):
        backend.run("detect", [ToolCall("detect", ref, None, {"noun": "cat"})])


@pytest.mark.parametrize(
    "families",
    [("grounding_dino", "clip", "blip2", "dpt"), ("owlv2", "siglip", "blip2_t5", "depth_anything")],
    ids=["gdino-clip-blip2opt-dpt", "owlv2-siglip-blip2t5-depthanything"],
)
def test_every_tool_runs_through_the_real_processing_path(paths, store, families):
    images, ref = store
    backend = HFBackend(images, **full_config(paths, *families))
    region = (20, 10, 120, 70)  # left, lower, right, upper
    x0, y0, x1, y1 = box_to_top_left(region, H)

    found = backend.run("detect", [ToolCall("detect", ref, region, {"noun": "Red Cat", "threshold": 0.0})])[0]
    if families[0] == "grounding_dino":
        assert found, "threshold 0 keeps every query"  # tiny OWLv2's random box head predicts zero-width boxes
    for det in found:
        bx0, by0, bx1, by1 = det["box"]
        assert x0 <= bx0 < bx1 <= x1 and y0 <= by0 < by1 <= y1, (det, (x0, y0, x1, y1))
        assert det["label"] == "red cat" and 0.0 <= det["score"] <= 1.0
    assert [d["score"] for d in found] == sorted((d["score"] for d in found), reverse=True)

    verdicts = backend.run("verify", [ToolCall("verify", ref, region, {"object_name": "cat", "property": "red"})])
    assert isinstance(verdicts[0], bool)
    scores = backend.run(
        "itm",
        [
            ToolCall("itm", ref, None, {"texts": ["a cat", "a dog", "a car"]}),
            ToolCall("itm", ref, region, {"texts": ["a"]}),
        ],
    )
    assert [len(s) for s in scores] == [3, 1] and all(np.isfinite(s) for row in scores for s in row)

    answers = backend.run(
        "vqa",
        [
            ToolCall("vqa", ref, region, {"question": "What is this?"}),
            ToolCall("vqa", ref, None, {"question": "Why?"}),
        ],
    )
    captions = backend.run("caption", [ToolCall("caption", ref, None, {})])
    for text in answers + captions:
        assert isinstance(text, str) and text == " ".join(text.lower().split())

    depths = backend.run("depth", [ToolCall("depth", ref, None, {}), ToolCall("depth", ref, region, {})])
    assert all(isinstance(d, float) and d >= 0.0 for d in depths)

    replies = backend.run("llm", [ToolCall("llm", None, None, {"prompt": "Is a cat an animal?"})])
    assert isinstance(replies[0], str)


def test_batches_respect_max_batch_size_and_identical_calls_run_once(paths, store, monkeypatch):
    images, ref = store
    backend = HFBackend(images, device="cpu", detect={"model": paths["owlv2"], "max_batch_size": 2})
    backend.run("detect", [ToolCall("detect", ref, None, {"noun": "cat"})])  # load
    model = backend.models._loaded[backend.models.loaded()[0]].model
    batch_sizes = []
    real_forward = model.forward

    def counting_forward(**kwargs):
        batch_sizes.append(kwargs["pixel_values"].shape[0])
        return real_forward(**kwargs)

    monkeypatch.setattr(model, "forward", counting_forward)
    calls = [ToolCall("detect", ref, (0, 0, 50 + 10 * i, 50), {"noun": "cat"}) for i in range(5)]
    calls.append(ToolCall("detect", ref, (0, 0, 50, 50), {"noun": "cat", "threshold": 0.05}))  # same row as calls[0]
    results = backend.run("detect", calls)
    assert batch_sizes == [2, 2, 1]
    assert len(results) == 6


def test_llm_engine_vllm_without_vllm_is_unavailable(paths, store):
    pytest.importorskip("torch")
    from vprl.executor.tools.hf.llm import vllm_available

    if vllm_available():
        pytest.skip("vllm is installed")
    images, _ = store
    backend = HFBackend(images, device="cpu", llm={"model": paths["causal_lm"], "engine": "vllm"})
    with pytest.raises(ToolUnavailable, match="vllm is not installed"):
        backend.run("llm", [ToolCall("llm", None, None, {"prompt": "hi"})])


@pytest.mark.parametrize("name", ["viunit", "stanic", "vipergpt"])
def test_tool_stack_yamls_are_valid_hf_configs(name):
    import yaml

    from vprl.executor.tools.hf.settings import parse_config
    from vprl.executor.tools.stack import stack_path, stack_settings

    with open(stack_path(name)) as fh:
        config = yaml.safe_load(fh)
    assert config["backend"] == "hf" and config["serve"]  # and how to serve it (vprl/executor/serve)
    config = stack_settings(config, {})  # the backend's settings, as build_backend passes them
    backend = HFBackend(ImageStore(), **config)  # validates every key; loads nothing
    assert backend.models.loaded() == []
    _, tools = parse_config(config)
    if name == "viunit":  # the paper's settings ([U] C.2; docs/references.md#tool-stacks)
        assert (tools["detect"].box_threshold, tools["detect"].text_threshold, tools["verify"].threshold) == (
            0.2,
            0.2,
            0.8,
        )
        vqa = tools["vqa"]
        assert (vqa.quantization, vqa.num_beams, vqa.max_length, vqa.min_length, vqa.length_penalty) == (
            "8bit",
            5,
            10,
            1,
            -1.0,
        )
        assert (tools["caption"].length_penalty, tools["caption"].max_length) == (1.0, 30)
        assert "depth" not in tools and "llm" not in tools
    if name == "stanic":
        assert tools["detect"].box_threshold == 0.1
