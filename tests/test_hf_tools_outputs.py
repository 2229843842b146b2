"""hf backend with fixed raw model outputs: the model forward/generate is replaced by a function that
returns chosen values, and everything around it (processors, post-processing, coordinate mapping,
score definitions, deduplication) is the real code."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

pytest.importorskip("transformers")

import tiny_models as tiny
import torch

from vprl.data.boxes import box_from_top_left
from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.hf import HFBackend

H, W = 100, 200  # the size of the `store` fixture (tests/conftest.py)
REGION = (50, 20, 150, 80)  # left, lower, right, upper: crop is 100 wide, 60 high, top-left corner (50, 20)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_tiny_outputs")
    families = ["grounding_dino", "owlv2", "clip", "siglip", "blip2", "blip2_t5", "dpt"]
    return {family: tiny.build(family, root) for family in families}


def loaded(backend, tool):
    (key,) = [k for k in backend.models.loaded() if k[1] == backend.tools[tool].model]
    return backend.models._loaded[key]


def warm(backend, tool, call):
    backend.run(tool, [call])  # loads the model through the real path
    return loaded(backend, tool)


def logit(p):
    return math.log(p / (1 - p))


# Three detections of the crop, as (score, box in the crop's top-left pixels):
#   q0 at the crop's top, q1 sticking out of its right edge (clipped), q2 weak, at the bottom-left corner.
CROP_BOXES = {"q0": (0.9, (40, 0, 60, 30)), "q1": (0.3, (80, 24, 110, 36)), "q2": (0.08, (0, 48, 20, 60))}
# The same in the whole image's top-left pixels (offset (50, 20), q1 clipped at x=100 -> 150) ...
IMAGE_BOXES = {"q0": [90, 20, 110, 50], "q1": [130, 44, 150, 56], "q2": [50, 68, 70, 80]}
# ... and in the API's bottom-left convention: q0 touches the region's upper edge, q2 its lower edge.
API_BOXES = {"q0": (90, 50, 110, 80), "q1": (130, 44, 150, 56), "q2": (50, 20, 70, 32)}


def fake_detector_forward(family, n_queries=6):
    """Forward returning CROP_BOXES as normalised cxcywh (OWLv2: relative to the crop padded to a square)."""
    norm_w, norm_h = (100, 100) if family == "owlv2" else (100, 60)

    def forward(**inputs):
        batch = inputs["pixel_values"].shape[0]
        boxes = torch.full((batch, n_queries, 4), 0.5)
        boxes[:, :, 2:] = 0.1
        scores = torch.full((batch, n_queries), -20.0)
        for q, (score, (x0, y0, x1, y1)) in enumerate(CROP_BOXES.values()):
            boxes[:, q] = torch.tensor(
                [(x0 + x1) / 2 / norm_w, (y0 + y1) / 2 / norm_h, (x1 - x0) / norm_w, (y1 - y0) / norm_h]
            )
            scores[:, q] = logit(score)
        if family == "owlv2":
            return SimpleNamespace(logits=scores[..., None], pred_boxes=boxes)
        logits = torch.full((batch, n_queries, 256), -20.0)
        logits[:, :, 1] = scores  # the first noun token carries the score
        return SimpleNamespace(logits=logits, pred_boxes=boxes)

    return forward


@pytest.mark.parametrize("family", ["grounding_dino", "owlv2"])
def test_detections_map_from_crop_to_whole_image_top_left(paths, store, family, monkeypatch):
    images, ref = store
    backend = HFBackend(images, device="cpu", detect={"model": paths[family]})
    det = warm(backend, "detect", ToolCall("detect", ref, None, {"noun": "cat"}))
    monkeypatch.setattr(det.model, "forward", fake_detector_forward(family))

    default, lowered = backend.run(
        "detect",
        [
            ToolCall("detect", ref, REGION, {"noun": "cat", "threshold": None}),
            ToolCall("detect", ref, REGION, {"noun": "cat", "threshold": 0.05}),
        ],
    )
    # Paper defaults (GroundingDINO 0.2, OWLv2 0.1) drop q2 (score 0.08); the call's threshold 0.05 keeps it.
    assert [d["box"] for d in default] == [IMAGE_BOXES["q0"], IMAGE_BOXES["q1"]]
    assert [d["box"] for d in lowered] == [IMAGE_BOXES[q] for q in ("q0", "q1", "q2")]
    assert [d["score"] for d in lowered] == pytest.approx([0.9, 0.3, 0.08], abs=1e-4)
    assert {d["label"] for d in lowered} == {"cat"}
    for q, detection in zip(("q0", "q1", "q2"), lowered):
        assert box_from_top_left(*detection["box"], H) == API_BOXES[q]


def test_configured_box_threshold_and_nms(paths, store, monkeypatch):
    images, ref = store
    backend = HFBackend(images, device="cpu", detect={"model": paths["owlv2"], "box_threshold": 0.5, "nms_iou": 0.5})
    det = warm(backend, "detect", ToolCall("detect", ref, None, {"noun": "cat"}))
    monkeypatch.setattr(det.model, "forward", fake_detector_forward("owlv2"))
    (found,) = backend.run("detect", [ToolCall("detect", ref, REGION, {"noun": "cat"})])
    assert [d["box"] for d in found] == [IMAGE_BOXES["q0"]]


def unit(c):
    return [c, math.sqrt(1 - c * c)]


TEXT_VECTORS = {
    "red thing": [1.0, 0.0],
    "blue thing": [0.0, 1.0],
    "a photo of a cat": unit(0.30),
    "a photo of a red cat": unit(0.32),  # beats the bare object by 0.02 in cosine: P = sigmoid(2) = 0.881
    "a photo of a blue cat": unit(0.31),  # by 0.01: P = sigmoid(1) = 0.731 < 0.8
}


def patch_matcher(monkeypatch, m):
    def image_features(pixel_values):
        red = pixel_values[:, 0].mean(dim=(1, 2)) > pixel_values[:, 2].mean(dim=(1, 2))
        return torch.stack([red.float(), (~red).float()], dim=1)

    def text_features(input_ids, attention_mask=None, **_):
        texts = m.processor.tokenizer.batch_decode(input_ids, skip_special_tokens=True)
        return torch.tensor([TEXT_VECTORS[t.strip()] for t in texts])

    monkeypatch.setattr(m.model, "get_image_features", image_features)
    monkeypatch.setattr(m.model, "get_text_features", text_features)
    m.model.logit_scale.data.fill_(math.log(100.0))
    if m.sigmoid:
        m.model.logit_bias.data.fill_(-50.0)


LEFT, RIGHT = (0, 0, 100, 100), (100, 0, 200, 100)


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_itm_scores_are_comparable_across_regions(paths, store, family, monkeypatch):
    images, ref = store
    backend = HFBackend(images, device="cpu", itm={"model": paths[family]})
    patch_matcher(monkeypatch, warm(backend, "itm", ToolCall("itm", ref, None, {"texts": ["a"]})))
    scores = backend.run(
        "itm",
        [
            ToolCall("itm", ref, LEFT, {"texts": ["red thing", "blue thing"]}),
            ToolCall("itm", ref, RIGHT, {"texts": ["blue thing", "red thing", "a photo of a cat"]}),
        ],
    )
    if family == "clip":  # cosine similarity
        assert scores == [pytest.approx([1.0, 0.0]), pytest.approx([1.0, 0.0, math.sqrt(1 - 0.09)])]
    else:  # sigmoid(100 * cos - 50)
        assert scores[0] == pytest.approx([1.0, 0.0], abs=1e-6) and scores[1][:2] == pytest.approx(
            [1.0, 0.0], abs=1e-6
        )
    # best_image_match("red thing") over [left, right] picks the left half.
    assert scores[0][0] > scores[1][1]


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_verify_is_a_softmax_against_the_bare_object_at_threshold_0_8(paths, store, family, monkeypatch):
    from vprl.executor.tools.hf import matching

    images, ref = store
    backend = HFBackend(images, device="cpu", verify={"model": paths[family]})
    m = warm(backend, "verify", ToolCall("verify", ref, None, {"object_name": "cat", "property": "red"}))
    patch_matcher(monkeypatch, m)
    calls = [
        ToolCall("verify", ref, LEFT, {"object_name": "cat", "property": "red"}),
        ToolCall("verify", ref, LEFT, {"object_name": "cat", "property": "blue"}),
    ]
    probs = matching.verify_probabilities(m, backend.tools["verify"], calls, images)
    assert probs == pytest.approx([1 / (1 + math.exp(-2)), 1 / (1 + math.exp(-1))], abs=1e-4)
    assert backend.run("verify", calls) == [True, False]


def fake_generate(cap, answers, captured):
    """generate() answering by the question in each row's prompt; decoder-only rows echo their prompt."""
    tok = cap.processor.tokenizer

    def generate(**kwargs):
        captured.append({k: v for k, v in kwargs.items() if k not in ("input_ids", "attention_mask", "pixel_values")})
        prompts = tok.batch_decode(kwargs["input_ids"], skip_special_tokens=True)
        rows = []
        for prompt in prompts:
            key = next(q for q in answers if q in prompt)
            ids = tok(answers[key], add_special_tokens=False)["input_ids"]
            rows.append(ids)
        width = max(len(r) for r in rows)
        out = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
        return torch.cat([kwargs["input_ids"], out], dim=1) if cap.decoder_only else out

    return generate


@pytest.mark.parametrize("family", ["blip2", "blip2_t5"])
def test_vqa_uses_viunit_generation_settings_and_cleans_answers(paths, store, family, monkeypatch):
    images, ref = store
    backend = HFBackend(images, device="cpu", vqa={"model": paths[family]}, caption={"model": paths[family]})
    cap = warm(backend, "vqa", ToolCall("vqa", ref, None, {"question": "what?"}))
    captured: list[dict] = []
    answers = {"what color": "  Red ", "what is this": " A  Cat", "": " Two Birds On A Tree"}
    monkeypatch.setattr(cap.model, "generate", fake_generate(cap, answers, captured))

    calls = [
        ToolCall("vqa", ref, LEFT, {"question": "what color is it?"}),
        ToolCall("vqa", ref, None, {"question": "what is this?"}),
        ToolCall("vqa", ref, LEFT, {"question": "what color is it?"}),  # identical to the first: one row
    ]
    assert backend.run("vqa", calls) == ["red", "a cat", "red"]
    assert captured[-1] == {
        "do_sample": False, "num_beams": 5, "max_new_tokens": 10, "min_new_tokens": 1, "length_penalty": -1.0,
        "repetition_penalty": 1.0,
    }  # fmt: skip
    assert backend.run("caption", [ToolCall("caption", ref, None, {})]) == ["two birds on a tree"]
    assert captured[-1]["length_penalty"] == 1.0 and captured[-1]["max_new_tokens"] == 30


def test_depth_is_larger_farther_from_one_forward_per_image(paths, store, monkeypatch):
    images, ref = store
    backend = HFBackend(images, device="cpu", depth={"model": paths["dpt"]})
    dm = warm(backend, "depth", ToolCall("depth", ref, None, {}))
    dm.maps.clear()
    forwards = []

    def forward(pixel_values):
        forwards.append(pixel_values.shape[0])
        batch, _, h, w = pixel_values.shape
        # Disparity grows down the image (the bottom is nearer), as in a typical street scene.
        rows = torch.arange(h, dtype=torch.float32)[:, None].expand(h, w)
        return SimpleNamespace(predicted_depth=rows.expand(batch, h, w).clone())

    monkeypatch.setattr(dm.model, "forward", forward)
    top, bottom, whole = (0, 50, 200, 100), (0, 0, 200, 50), None
    calls = [ToolCall("depth", ref, box, {}) for box in (top, bottom, whole)]
    far, near, middle = backend.run("depth", calls)
    assert forwards == [1]  # three regions of one image: one forward
    assert far > middle > near >= 0.0
    assert backend.run("depth", calls[:1]) == [far] and forwards == [1]  # the map is cached

    metric = HFBackend(images, device="cpu", depth={"model": paths["dpt"], "output": "depth"})
    metric_dm = warm(metric, "depth", calls[0])
    metric_dm.maps.clear()
    monkeypatch.setattr(metric_dm.model, "forward", forward)
    top_m, bottom_m = metric.run("depth", calls[:2])
    assert top_m < bottom_m  # a metric map is used as is: the rows value itself
