"""`llm`: text-only answers for `llm_query`, greedy, from a causal LM (transformers or vLLM).

transformers: left-padded batched `generate`, greedy, only the new tokens are decoded. vLLM (GPU
only; `engine: vllm`) runs the same prompts with temperature 0. With `chat_template: true` and a
tokenizer that has one, the prompt is sent as a single user turn (instruction-tuned models expect it).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.devices import vllm_refusal
from vprl.executor.tools.errors import ToolError, ToolUnavailable
from vprl.executor.tools.hf.loading import Placement, from_pretrained, input_device, resolve_device
from vprl.executor.tools.hf.regions import chunks, dedupe
from vprl.executor.tools.hf.settings import LlmSettings


@dataclass
class TextModel:
    engine: str
    model: Any  # transformers model or vllm.LLM
    tokenizer: Any


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def load_text_model(path: str, placement: Placement, settings: LlmSettings) -> TextModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if settings.engine == "vllm":
        if not vllm_available():
            raise ToolUnavailable(
                "llm.engine is 'vllm' but vllm is not installed (pip install 'vprl[vllm]', GPU only)"
            )
        device = resolve_device(placement.device)
        if device == "cpu":
            raise ToolUnavailable("llm.engine 'vllm' needs a CUDA device in this toolkit; use engine: transformers")
        refusal = vllm_refusal(device, "llm.engine 'vllm'", "use engine: transformers or serve the tools")
        if refusal:
            raise ToolUnavailable(refusal)
        from vllm import LLM

        quant = {"none": None, "8bit": "bitsandbytes", "4bit": "bitsandbytes"}[placement.quantization]
        model = LLM(
            model=path,
            dtype=placement.dtype,
            quantization=quant,
            gpu_memory_utilization=settings.gpu_memory_utilization,
        )
        return TextModel("vllm", model, model.get_tokenizer())
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # batched generate needs a pad token; masked out anyway
    return TextModel("transformers", from_pretrained(AutoModelForCausalLM, path, placement), tokenizer)


def render(tm: TextModel, settings: LlmSettings, prompt: str) -> str:
    if settings.chat_template and getattr(tm.tokenizer, "chat_template", None):
        return tm.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    return prompt


def llm(tm: TextModel, settings: LlmSettings, calls: Sequence[ToolCall]) -> list[str]:
    prompts = []
    for call in calls:
        prompt = call.args.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ToolError("llm needs a non-empty `prompt` string")
        prompts.append(render(tm, settings, prompt))
    uniq, where = dedupe(prompts)
    if tm.engine == "vllm":
        answers = generate_vllm(tm, settings, uniq)
    else:
        answers = []
        for batch in chunks(uniq, settings.max_batch_size):
            answers.extend(generate_hf(tm, settings, list(batch)))
    return [answers[i].strip() for i in where]


def generate_hf(tm: TextModel, settings: LlmSettings, prompts: list[str]) -> list[str]:
    import torch

    # A rendered chat template already carries the BOS token; adding it again would double it.
    templated = settings.chat_template and getattr(tm.tokenizer, "chat_template", None)
    inputs = tm.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=not templated)
    inputs = inputs.to(input_device(tm.model))
    with torch.inference_mode():
        out = tm.model.generate(
            **inputs, do_sample=False, max_new_tokens=settings.max_new_tokens, pad_token_id=tm.tokenizer.pad_token_id
        )
    return tm.tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def generate_vllm(tm: TextModel, settings: LlmSettings, prompts: list[str]) -> list[str]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=settings.max_new_tokens)
    return [o.outputs[0].text for o in tm.model.generate(prompts, params, use_tqdm=False)]
