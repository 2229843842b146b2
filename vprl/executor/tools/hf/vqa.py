"""`vqa` and `caption` with BLIP-2 (`Blip2ForConditionalGeneration`), beam search as in ViUniT.

Calls are deduplicated by (region, prompt) and generated in batches of `max_batch_size` (ViUniT: 4).
Decoder-only language models (OPT, Llama) are left-padded and their prompt tokens are cut from the
output; Flan-T5 returns only the answer. Answers are lower-cased and stripped.

A `vqa` call with `choices` also gets `scores`: each choice is scored by the language model as the
sum of the log-probabilities of its tokens after the prompt (teacher-forced, the image's query
tokens in front as in generation), and the scores are a softmax over the call's choices. This is
ExoViP's P(yes) - P(no) for choices ["yes", "no"]. The `answer` stays the generated one, so it
means the same with or without choices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.errors import ToolError, ToolUnavailable
from vprl.executor.tools.hf.loading import Placement, float_dtype, from_pretrained, input_device, model_type
from vprl.executor.tools.hf.regions import Region, chunks, crop_pil, dedupe, region_of
from vprl.executor.tools.hf.settings import GenerationSettings
from vprl.executor.tools.images import ImageStore


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


def answer(cap: Captioner, settings: GenerationSettings, calls: Sequence[ToolCall], images: ImageStore) -> list[Any]:
    rows, row_of_call = dedupe([(region_of(call, images), prompt_of(call, settings)) for call in calls])
    texts: list[str] = []
    for batch in chunks(rows, settings.max_batch_size):
        texts.extend(generate(cap, settings, [r for r, _ in batch], [p for _, p in batch], images))
    answers: list[Any] = [clean(texts[row]) for row in row_of_call]
    scored = [i for i, call in enumerate(calls) if call.tool == "vqa" and call.args.get("choices") is not None]
    if scored:
        items = [(rows[row_of_call[i]], str(c)) for i in scored for c in calls[i].args["choices"]]
        unique, item_of = dedupe(items)
        logps: list[float] = []
        for batch in chunks(unique, settings.max_batch_size):
            logps.extend(
                choice_logprobs(
                    cap, [r for (r, _), _ in batch], [p for (_, p), _ in batch], [c for _, c in batch], images
                )
            )
        start = 0
        for i in scored:
            choices = calls[i].args["choices"]
            mine = [logps[item_of[start + k]] for k in range(len(choices))]
            start += len(choices)
            answers[i] = {"answer": answers[i], "scores": dict(zip(choices, softmax(mine)))}
    return answers


def softmax(logps: Sequence[float]) -> list[float]:
    top = max(logps)
    weights = [math.exp(v - top) for v in logps]
    total = sum(weights)
    return [w / total for w in weights]


def choice_logprobs(
    cap: Captioner, regions: Sequence[Region], prompts: Sequence[str], choices: Sequence[str], images: ImageStore
) -> list[float]:
    """log P(choice | image region, prompt): the sum over the choice's tokens, one value per row."""
    import torch

    tok = cap.processor.tokenizer
    crops = [crop_pil(images, region) for region in regions]
    inputs = cap.processor(images=crops, text=list(prompts), return_tensors="pt", padding=True)
    pixels = inputs["pixel_values"].to(input_device(cap.model), float_dtype(cap.model))
    lead = "" if not cap.decoder_only else " "  # a decoder-only LM continues "... Answer:" with " yes"
    targets = [tok(lead + choice, add_special_tokens=False)["input_ids"] for choice in choices]
    if any(not t for t in targets):
        raise ToolError(f"vqa: a choice in {list(choices)!r} has no tokens")
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    if cap.decoder_only:
        # Prompt (with the image tokens) + choice, right-padded: with causal attention the padding
        # after a row's last token changes nothing, and every row's positions start at 0.
        prompts_ids = [ids[mask.bool()].tolist() for ids, mask in zip(inputs["input_ids"], inputs["attention_mask"])]
        rows = [p + t for p, t in zip(prompts_ids, targets)]
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        with torch.inference_mode():
            logits = cap.model(
                pixel_values=pixels, input_ids=ids.to(pixels.device), attention_mask=mask.to(pixels.device)
            ).logits
        logp = torch.log_softmax(logits.float(), dim=-1)
        out = []
        for row, (p, t) in enumerate(zip(prompts_ids, targets)):
            # The logits at position j predict token j + 1.
            positions = torch.arange(len(p) - 1, len(p) - 1 + len(t), device=logp.device)
            out.append(float(logp[row, positions, torch.tensor(t, device=logp.device)].sum()))
        return out
    width = max(len(t) for t in targets)
    labels = torch.tensor([t + [-100] * (width - len(t)) for t in targets])
    device = input_device(cap.model)
    with torch.inference_mode():
        logits = cap.model(
            pixel_values=pixels,
            input_ids=inputs["input_ids"].to(device),
            attention_mask=inputs["attention_mask"].to(device),
            labels=labels.to(device),
        ).logits
    logp = torch.log_softmax(logits.float(), dim=-1)
    labels = labels.to(logp.device)
    picked = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return [float(v) for v in (picked * (labels != -100)).sum(dim=1)]


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
