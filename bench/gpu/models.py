"""Random-weight models at the sizes of `bench/gpu/sizes.yaml` (the published ones, or `tiny` for the
CPU test), built once each, directly on their device in their dtype (bf16 on a GPU: a 12B BLIP-2
built on the CPU in fp32 and then moved takes minutes and twice the memory), and installed into an
`hf` tool backend as if loaded from their checkpoints; and the policy. Speed and memory do not
depend on the weights, so nothing is downloaded. Processors use pillow image processors and
tokenizers trained here (tests/tiny_models.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

SIZES = Path(__file__).with_name("sizes.yaml")
# Each tool of a stack -> the entry of sizes.yaml that stands for its model (verify and itm: the
# stack's CLIP).
FAMILIES = {"detect": "detect", "vqa": "blip2", "caption": "blip2", "depth": "depth"}
KINDS = {"detect": "detector", "blip2": "captioner", "depth": "depth"}  # the backend's model kinds; CLIP: matcher
VISION_TOOLS = ("detect", "verify", "itm", "vqa", "caption", "depth")


def sizes(scale: str) -> dict[str, Any]:
    return yaml.safe_load(SIZES.read_text(encoding="utf-8"))[scale]


def family_of(tool: str, clip: str) -> str:
    return FAMILIES.get(tool, clip)


def instantiate(cls: Any, config: Any, device: str, dtype: Any) -> Any:
    """`cls` with random weights, created on `device` in `dtype` (transformers' own `_from_config`, as
    `from_config` does it), in eval mode."""
    import torch

    with torch.device(device):
        model = cls._from_config(config, dtype=dtype)
    # A device context reaches factory functions, not legacy constructors: Grounding DINO's
    # `level_embed` (`nn.Parameter(torch.Tensor(...))`) stayed on the CPU on an H200, the tool sent its
    # inputs to its first parameter's device, and its text encoder on the GPU refused them. A
    # checkpoint loaded with `device_map` (the real path) has no such stray; here it is moved.
    stray = sorted({p.device.type for p in model.parameters()} - {torch.device(device).type})
    if stray:
        print(f"acceptance: {cls.__name__} had parameters on {stray}; moved to {device}", file=sys.stderr)
    return model.to(device).eval()


def build(family: str, scale: str, root: Path, device: str, dtype: Any) -> tuple[Any, Any]:
    """(model, processor) of one entry of sizes.yaml."""
    import transformers as tf
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.dpt.image_processing_pil_dpt import DPTImageProcessorPil
    from transformers.models.grounding_dino.image_processing_pil_grounding_dino import GroundingDinoImageProcessorPil

    from tests import tiny_models as tiny

    size = sizes(scale)[family]
    if family == "detect":
        bert = tiny.wordpiece_tokenizer(root / "tok_wp")
        swin = tf.SwinConfig(out_features=["stage2", "stage3", "stage4"], **size["swin"])
        text = tf.BertConfig(**{"vocab_size": max(len(bert), 30522), **size["bert"]})
        cfg = tf.GroundingDinoConfig(
            backbone_config=swin, text_config=text, disable_custom_kernels=True, **size.get("decoder", {})
        )
        edge = size["swin"]["image_size"]
        ip = GroundingDinoImageProcessorPil(size={"shortest_edge": edge, "longest_edge": edge * 4 // 3})
        model = instantiate(tf.GroundingDinoForObjectDetection, cfg, device, dtype)
        return model, tf.GroundingDinoProcessor(image_processor=ip, tokenizer=bert)
    if family.startswith("clip"):
        bpe = tiny.bpe_tokenizer(root / "tok_bpe", add_eos=True, max_length=77)
        text = {**size["text"], "max_position_embeddings": 77, "bos_token_id": bpe.bos_token_id,
                "eos_token_id": bpe.eos_token_id, "pad_token_id": bpe.pad_token_id, "vocab_size": max(len(bpe), 49408)}  # fmt: skip
        cfg = tf.CLIPConfig(text_config=text, vision_config=size["vision"], projection_dim=size["projection_dim"])
        edge = size["vision"]["image_size"]
        ip = CLIPImageProcessorPil(size={"shortest_edge": edge}, crop_size={"height": edge, "width": edge})
        return instantiate(tf.CLIPModel, cfg, device, dtype), tf.CLIPProcessor(image_processor=ip, tokenizer=bpe)
    if family == "blip2":
        nq = size.get("num_query_tokens", 32)
        edge = size["vision"]["image_size"]
        tok = tiny.bpe_tokenizer(root / "tok_t5", add_eos=True, max_length=64)
        proc = tf.Blip2Processor(image_processor=BlipImageProcessorPil(size={"height": edge, "width": edge}),
                                 tokenizer=tok, num_query_tokens=nq)  # fmt: skip
        t5 = {**size["t5"], "vocab_size": max(len(proc.tokenizer), size["t5"]["vocab_size"])}
        text = tf.T5Config(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                           decoder_start_token_id=tok.pad_token_id, **t5)  # fmt: skip
        qformer = tf.Blip2QFormerConfig(**{"encoder_hidden_size": size["vision"]["hidden_size"], **size["qformer"]})
        cfg = tf.Blip2Config(vision_config=tf.Blip2VisionConfig(**size["vision"]), qformer_config=qformer,
                             text_config=text, num_query_tokens=nq,
                             image_token_id=proc.tokenizer.convert_tokens_to_ids("<image>"))  # fmt: skip
        return instantiate(tf.Blip2ForConditionalGeneration, cfg, device, dtype), proc
    edge = size["image_size"]
    processor = DPTImageProcessorPil(size={"height": edge, "width": edge}, keep_aspect_ratio=False)
    return instantiate(tf.DPTForDepthEstimation, tf.DPTConfig(**size), device, dtype), processor


def wrap(family: str, model: Any, processor: Any) -> tuple[str, Any]:
    """The backend's (kind, object) for a built model."""
    from vprl.executor.tools.hf import depth, detection, matching, vqa

    if family == "detect":
        return "detector", detection.Detector("grounding-dino", model, processor)
    if family == "blip2":
        return "captioner", vqa.Captioner(model, processor)
    if family == "depth":
        return "depth", depth.DepthModel(model, processor)
    return "matcher", matching.Matcher("clip", model, processor)


def install(backend: Any, built: dict[str, tuple[Any, Any]], clip: str) -> None:
    """Put the built models into `backend`'s model cache under its stack's model names, so each tool
    finds its model as if loaded from the checkpoint; tools of one family share one model."""
    for tool in [t for t in VISION_TOOLS if backend.supports(t)]:
        family = family_of(tool, clip)
        kind, obj = wrap(family, *built[family])
        backend.models.put(kind, backend.tools[tool].model, backend.tools[tool].placement(backend.defaults), obj)


def params_b(model: Any) -> float:
    return round(sum(p.numel() for p in model.parameters()) / 1e9, 3)


def policy(
    scale: str, out: Path, corpus: list[str], device: str, dtype: Any, family: str = "policy"
) -> tuple[Any, Any]:
    """(model, tokenizer): a random model of the policy's size (`family`: "policy", CodeLlama's Llama,
    or "codegemma", a Gemma) and a tokenizer trained on `corpus` (the prompts and programs, so a prompt
    takes about as many tokens as under a code model's own; it uses the first ids of the model's
    vocabulary, while the logits span all of it). `out` gets the config and tokenizer: what the layout
    check and trl read."""
    import torch
    from transformers import GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM

    from vprl.train.policy.tiny import train_tokenizer

    size = sizes(scale)[family]
    config_class, model_class = (
        (GemmaConfig, GemmaForCausalLM) if family == "codegemma" else (LlamaConfig, LlamaForCausalLM)
    )
    tokenizer = train_tokenizer(
        corpus, vocab_size=min(size["vocab_size"], 4096), context=size["max_position_embeddings"]
    )
    config = config_class(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id, **size)  # fmt: skip
    torch.manual_seed(0)
    model = instantiate(model_class, config, device, dtype)
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return model, tokenizer
