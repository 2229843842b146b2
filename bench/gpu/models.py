"""Random-weight models at the sizes of `bench/gpu/sizes.yaml` (the published ones, or `tiny` for the
CPU test), installed into an `hf` tool backend as if loaded from their checkpoints, and the policy.
Speed and memory do not depend on the weights, so nothing is downloaded. Processors use pillow image
processors and tokenizers trained here (tests/tiny_models.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

SIZES = Path(__file__).with_name("sizes.yaml")
# Each tool of a stack -> the entry of sizes.yaml that stands for its model.
FAMILIES = {"detect": "detect", "vqa": "blip2", "caption": "blip2", "depth": "depth"}


def sizes(scale: str) -> dict[str, Any]:
    return yaml.safe_load(SIZES.read_text(encoding="utf-8"))[scale]


def install(backend: Any, scale: str, root: Path, clip: str = "clip_336") -> dict[str, float]:
    """Build every tool model `backend`'s stack names at `scale` and put it in the backend's model cache
    under the stack's own model name; returns each model's parameter count (billions)."""
    import torch

    from executor.tools.hf import depth, detection, matching, vqa
    from executor.tools.hf.loading import resolve_device, torch_dtype
    from tests import tiny_models as tiny

    s = sizes(scale)
    built: dict[str, Any] = {}
    params: dict[str, float] = {}

    def place(model: Any, tool: str) -> tuple[Any, Any]:
        placement = backend.tools[tool].placement(backend.defaults)
        return model.to(resolve_device(placement.device), torch_dtype(placement.dtype)).eval(), placement

    for tool in [t for t in ("detect", "verify", "itm", "vqa", "caption", "depth") if backend.supports(t)]:
        torch.manual_seed(0)
        family = FAMILIES.get(tool, clip)
        if family not in built:
            built[family] = _build(family, s[family], root, tiny)
            params[family] = sum(p.numel() for p in built[family][0].parameters()) / 1e9
        model, processor = built[family]
        model, placement = place(model, tool)
        if family == "detect":
            obj, kind = detection.Detector("grounding-dino", model, processor), "detector"
        elif family == "blip2":
            obj, kind = vqa.Captioner(model, processor), "captioner"
        elif family == "depth":
            obj, kind = depth.DepthModel(model, processor), "depth"
        else:
            obj, kind = matching.Matcher("clip", model, processor), "matcher"
        backend.models.put(kind, backend.tools[tool].model, placement, obj)
    return params


def _build(family: str, size: dict[str, Any], root: Path, tiny: Any) -> tuple[Any, Any]:
    import transformers as tf
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.dpt.image_processing_pil_dpt import DPTImageProcessorPil
    from transformers.models.grounding_dino.image_processing_pil_grounding_dino import GroundingDinoImageProcessorPil

    if family == "detect":
        bert = tiny.wordpiece_tokenizer(root / "tok_wp")
        swin = tf.SwinConfig(out_features=["stage2", "stage3", "stage4"], **size["swin"])
        text = tf.BertConfig(**{"vocab_size": max(len(bert), 30522), **size["bert"]})
        cfg = tf.GroundingDinoConfig(
            backbone_config=swin, text_config=text, disable_custom_kernels=True, **size.get("decoder", {})
        )
        edge = size["swin"]["image_size"]
        ip = GroundingDinoImageProcessorPil(size={"shortest_edge": edge, "longest_edge": edge * 4 // 3})
        return tf.GroundingDinoForObjectDetection(cfg), tf.GroundingDinoProcessor(image_processor=ip, tokenizer=bert)
    if family.startswith("clip"):
        bpe = tiny.bpe_tokenizer(root / "tok_bpe", add_eos=True, max_length=77)
        text = {**size["text"], "max_position_embeddings": 77, "bos_token_id": bpe.bos_token_id,
                "eos_token_id": bpe.eos_token_id, "pad_token_id": bpe.pad_token_id, "vocab_size": max(len(bpe), 49408)}  # fmt: skip
        cfg = tf.CLIPConfig(text_config=text, vision_config=size["vision"], projection_dim=size["projection_dim"])
        edge = size["vision"]["image_size"]
        ip = CLIPImageProcessorPil(size={"shortest_edge": edge}, crop_size={"height": edge, "width": edge})
        return tf.CLIPModel(cfg), tf.CLIPProcessor(image_processor=ip, tokenizer=bpe)
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
        return tf.Blip2ForConditionalGeneration(cfg), proc
    cfg = tf.DPTConfig(**size)
    edge = size["image_size"]
    return tf.DPTForDepthEstimation(cfg), DPTImageProcessorPil(
        size={"height": edge, "width": edge}, keep_aspect_ratio=False
    )


def policy(scale: str, out: Path, corpus: list[str], dtype: Any) -> tuple[Any, Path]:
    """A random Llama of the policy's size, with a tokenizer trained on `corpus`; the folder `out` holds
    its config and tokenizer (what the recipe's checks read), the weights stay in memory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from train.policy.tiny import train_tokenizer

    size = sizes(scale)["policy"]
    tokenizer = train_tokenizer(
        corpus, vocab_size=min(size["vocab_size"], 2048), context=size["max_position_embeddings"]
    )
    config = LlamaConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **size)  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config).to(dtype)
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return model, out
