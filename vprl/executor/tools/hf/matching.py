"""`verify` and `itm`: image-text matching with CLIP or SigLIP (dual encoders via `AutoModel`).

Each distinct region is encoded once and each distinct text once per batch of calls; scores are
dot products of normalised embeddings.

- `itm` returns one score per text that is comparable across regions (best_image_match compares
  regions): the cosine similarity for CLIP (no logit scale, so no dependence on the other texts)
  and sigmoid(scale * cos + bias) for SigLIP (its own calibrated match probability).
- `verify(object_name, property)`: ViUniT thresholds CLIP at 0.8, but raw CLIP cosines are ~0.2-0.35,
  so 0.8 cannot be a cosine. We read it as a probability: softmax of the model's logits over
  ["a photo of a {property} {object}", *contrasts] (default contrast: "a photo of a {object}"),
  true when the property text takes more than `threshold` of the mass. This is ViperGPT's binary
  X-VLM check (attribute phrase vs. the bare object) with CLIP's own logit scale (100), so 0.8
  means the property text beats the bare object by ln(4)/100 ~ 0.014 in cosine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.errors import ToolError, ToolUnavailable
from vprl.executor.tools.hf.loading import Placement, float_dtype, from_pretrained, input_device, model_type
from vprl.executor.tools.hf.regions import Region, chunks, crop_pil, dedupe, region_of
from vprl.executor.tools.hf.settings import ItmSettings, VerifySettings
from vprl.executor.tools.images import ImageStore

FAMILIES = ("clip", "siglip", "siglip2")


@dataclass
class Matcher:
    family: str
    model: Any
    processor: Any

    @property
    def sigmoid(self) -> bool:
        return self.family.startswith("siglip")


def load_matcher(path: str, placement: Placement) -> Matcher:
    from transformers import AutoModel, AutoProcessor

    family = model_type(path)
    if family not in FAMILIES:
        raise ToolUnavailable(f"verify/itm: {path!r} is a {family!r} model; supported families: {list(FAMILIES)}")
    return Matcher(family, from_pretrained(AutoModel, path, placement), AutoProcessor.from_pretrained(path))


def _features(output: Any):
    # transformers 5 returns a model output whose pooler_output is the projected embedding.
    return output.pooler_output if hasattr(output, "pooler_output") else output


def embed_images(m: Matcher, regions: Sequence[Region], images: ImageStore, batch_size: int):
    import torch

    parts = []
    for batch in chunks(list(regions), batch_size):
        inputs = m.processor(images=[crop_pil(images, r) for r in batch], return_tensors="pt")
        pixels = inputs["pixel_values"].to(input_device(m.model), float_dtype(m.model))
        with torch.inference_mode():
            parts.append(_features(m.model.get_image_features(pixel_values=pixels)).float())
    feats = torch.cat(parts)
    return feats / feats.norm(dim=-1, keepdim=True)


def embed_texts(m: Matcher, texts: Sequence[str], batch_size: int):
    import torch

    # SigLIP was trained on texts padded to the full length; other paddings shift its embeddings.
    padding = "max_length" if m.sigmoid else True
    parts = []
    for batch in chunks(list(texts), batch_size):
        inputs = m.processor(text=list(batch), return_tensors="pt", padding=padding, truncation=True)
        inputs = {k: v.to(input_device(m.model)) for k, v in inputs.items()}
        with torch.inference_mode():
            parts.append(_features(m.model.get_text_features(**inputs)).float())
    feats = torch.cat(parts)
    return feats / feats.norm(dim=-1, keepdim=True)


def cosines(m: Matcher, regions: list[Region], texts: list[str], images: ImageStore, batch_size: int):
    """(len(distinct regions), len(distinct texts)) cosine matrix plus the index maps of both."""
    uniq_regions, region_idx = dedupe(regions)
    uniq_texts, text_idx = dedupe(texts)
    sims = embed_images(m, uniq_regions, images, batch_size) @ embed_texts(m, uniq_texts, batch_size).T
    return sims, region_idx, text_idx


def logits_of(m: Matcher, cos):
    """The model's own logits: exp(logit_scale) * cos (+ logit_bias for SigLIP)."""
    logits = cos * m.model.logit_scale.detach().exp().float().to(cos.device)
    if m.sigmoid:
        logits = logits + m.model.logit_bias.detach().float().to(cos.device)
    return logits


def itm(m: Matcher, settings: ItmSettings, calls: Sequence[ToolCall], images: ImageStore) -> list[list[float]]:
    regions = [region_of(call, images) for call in calls]
    per_call = []
    for call in calls:
        texts = call.args.get("texts")
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise ToolError("itm needs `texts`: a non-empty list of strings")
        per_call.append([settings.template.format(text=t) for t in texts])
    flat = [t for texts in per_call for t in texts]
    sims, region_idx, text_idx = cosines(m, regions, flat, images, settings.max_batch_size)
    scores = logits_of(m, sims).sigmoid() if m.sigmoid else sims
    results, pos = [], 0
    for i, texts in enumerate(per_call):
        row = scores[region_idx[i]]
        results.append([round(float(row[text_idx[pos + j]]), 6) for j in range(len(texts))])
        pos += len(texts)
    return results


def verify_texts(settings: VerifySettings, call: ToolCall) -> list[str]:
    obj, prop = call.args.get("object_name"), call.args.get("property")
    if not isinstance(obj, str) or not obj.strip() or not isinstance(prop, str) or not prop.strip():
        raise ToolError("verify needs non-empty `object_name` and `property` strings")
    return [t.format(object=obj.strip(), property=prop.strip()) for t in [settings.template, *settings.contrasts]]


def verify_probabilities(
    m: Matcher, settings: VerifySettings, calls: Sequence[ToolCall], images: ImageStore
) -> list[float]:
    """P(property text) under a softmax over [property text, *contrast texts] for each call."""
    regions = [region_of(call, images) for call in calls]
    per_call = [verify_texts(settings, call) for call in calls]
    flat = [t for texts in per_call for t in texts]
    sims, region_idx, text_idx = cosines(m, regions, flat, images, settings.max_batch_size)
    logits = logits_of(m, sims)
    probs, pos = [], 0
    for i, texts in enumerate(per_call):
        row = logits[region_idx[i], [text_idx[pos + j] for j in range(len(texts))]]
        probs.append(float(row.softmax(-1)[0]))
        pos += len(texts)
    return probs


def verify(m: Matcher, settings: VerifySettings, calls: Sequence[ToolCall], images: ImageStore) -> list[bool]:
    return [p > settings.threshold for p in verify_probabilities(m, settings, calls, images)]
