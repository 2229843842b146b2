"""`vqa` and `caption` with BLIP-2 (`Blip2ForConditionalGeneration`), beam search as in ViUniT.

Calls are deduplicated by (region, prompt) and generated in batches of `max_batch_size` (ViUniT: 4).
Decoder-only language models (OPT, Llama) are left-padded and their prompt tokens are cut from the
output; Flan-T5 returns only the answer. Answers are lower-cased and stripped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from executor.tools.base import ImageStore, ToolCall, ToolError, ToolUnavailable
from executor.tools.hf.loading import Placement, float_dtype, from_pretrained, input_device, model_type
from executor.tools.hf.regions import Region, chunks, crop_pil, dedupe, region_of
from executor.tools.hf.settings import GenerationSettings


@dataclass
class Captioner:
    model: Any
    processor: Any

    @property
    def decoder_only(self) -> bool:
        return not self.model.config.text_config.is_encoder_decoder


def load_captioner(path: str, placement: Placement) -> Captioner:
    from transformers import AutoProcessor, Blip2ForConditionalGeneration

    family = model_type(path)
    if family != "blip-2":
        raise ToolUnavailable(f"vqa/caption: {path!r} is a {family!r} model; supported: 'blip-2'")
    model = from_pretrained(Blip2ForConditionalGeneration, path, placement)
    processor = AutoProcessor.from_pretrained(path)
    if not model.config.text_config.is_encoder_decoder:
        processor.tokenizer.padding_side = "left"  # batched generation continues from the real last token
    return Captioner(model, processor)


def prompt_of(call: ToolCall, settings: GenerationSettings) -> str:
    if call.tool == "caption":
        return settings.prompt
    question = call.args.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ToolError("vqa needs a non-empty `question` string")
    return settings.prompt.format(question=question.strip())


def answer(cap: Captioner, settings: GenerationSettings, calls: Sequence[ToolCall], images: ImageStore) -> list[str]:
    rows, row_of_call = dedupe([(region_of(call, images), prompt_of(call, settings)) for call in calls])
    texts: list[str] = []
    for batch in chunks(rows, settings.max_batch_size):
        texts.extend(generate(cap, settings, [r for r, _ in batch], [p for _, p in batch], images))
    return [clean(texts[row]) for row in row_of_call]


def clean(text: str) -> str:
    return " ".join(text.lower().split())


def generate(
    cap: Captioner, settings: GenerationSettings, regions: Sequence[Region], prompts: Sequence[str], images: ImageStore
) -> list[str]:
    import torch

    crops = [crop_pil(images, region) for region in regions]
    inputs = cap.processor(images=crops, text=list(prompts), return_tensors="pt", padding=True)
    inputs = inputs.to(input_device(cap.model))
    inputs["pixel_values"] = inputs["pixel_values"].to(float_dtype(cap.model))
    with torch.inference_mode():
        out = cap.model.generate(
            **inputs,
            do_sample=False,
            num_beams=settings.num_beams,
            max_new_tokens=settings.max_length,
            min_new_tokens=settings.min_length,
            length_penalty=settings.length_penalty,
            repetition_penalty=settings.repetition_penalty,
        )
    prompt_len = inputs["input_ids"].shape[1]
    if cap.decoder_only and out.shape[1] >= prompt_len and bool((out[:, :prompt_len] == inputs["input_ids"]).all()):
        # Decoder-only BLIP-2 returns prompt + answer: keep the answer only.
        out = out[:, prompt_len:]
    return cap.processor.batch_decode(out, skip_special_tokens=True)
