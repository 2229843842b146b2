"""Tiny random checkpoints of every model family the hf backend serves, built offline.

Used by the tests and by `bench/tools.py` on CPU: each builder writes a checkpoint directory with
its processor (Pil image processors, since torchvision is not installed; tokenizers trained here
with `tokenizers`) that `from_pretrained` reloads without network. Weights are random: answers are
meaningless, shapes and the whole pre/post-processing path are real.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

WORDS = [
    "a",
    "an",
    "the",
    "photo",
    "of",
    "cat",
    "dog",
    "person",
    "red",
    "blue",
    "green",
    "car",
    "bird",
    "tree",
    "table",
    "cup",
    "left",
    "right",
    "top",
    "bottom",
    "small",
    "large",
    "what",
    "is",
    "this",
    "color",
    "shape",
    "question",
    "answer",
    "yes",
    "no",
    "two",
    "three",
    "there",
    "in",
    "on",
    "under",
    "near",
    "wooden",
    "metal",
    "picture",
]


def _corpus() -> list[str]:
    import random

    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(400)] + [" ".join(WORDS)] * 5


def bpe_tokenizer(out_dir: str | Path, add_eos: bool, max_length: int = 32):
    """Byte-level BPE with <|bos|>/<|eos|>/<|pad|>; `add_eos` appends EOS (CLIP-style text encoders pool on it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    # pad = 0: OWL-ViT/OWLv2 treat a query whose first id is 0 as padding. eos != 2: CLIP treats
    # eos_token_id == 2 as a legacy config and pools on the largest id instead of on EOS.
    specials = ["<|pad|>", "<|bos|>", "<|reserved|>", "<|eos|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    bos, eos = tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")
    single = "<|bos|> $A <|eos|>" if add_eos else "<|bos|> $A"
    tok.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[("<|bos|>", bos), ("<|eos|>", eos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        padding_side="right" if add_eos else "left",
        model_max_length=max_length,
    )
    fast.save_pretrained(str(out_dir))
    return fast


def wordpiece_tokenizer(out_dir: str | Path):
    """BERT-style WordPiece (GroundingDINO's text encoder needs token_type_ids and [CLS]/[SEP])."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(_corpus(), trainer=trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    fast = BertTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]",
        mask_token="[MASK]", model_max_length=32,
    )  # fmt: skip
    fast.save_pretrained(str(out_dir))
    return fast


def _save(out: Path, model: Any, processor: Any) -> str:
    model.save_pretrained(str(out))
    processor.save_pretrained(str(out))
    return str(out)


def grounding_dino(out: Path, tokens: Path) -> str:
    from transformers import (
        BertConfig,
        GroundingDinoConfig,
        GroundingDinoForObjectDetection,
        GroundingDinoProcessor,
        SwinConfig,
    )
    from transformers.models.grounding_dino.image_processing_pil_grounding_dino import GroundingDinoImageProcessorPil

    tok = wordpiece_tokenizer(tokens / "wordpiece")
    backbone = SwinConfig(image_size=224, patch_size=4, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2],
                          window_size=7, out_features=["stage2", "stage3", "stage4"])  # fmt: skip
    text = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    # decoder_layers >= 2: transformers 5.23 fails to tie bbox_embed with a single decoder layer.
    cfg = GroundingDinoConfig(
        backbone_config=backbone, text_config=text, d_model=32, num_queries=20, encoder_layers=1, decoder_layers=2,
        encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=2, decoder_attention_heads=2,
        num_feature_levels=4, encoder_n_points=2, decoder_n_points=2, max_text_len=32, disable_custom_kernels=True,
    )  # fmt: skip
    ip = GroundingDinoImageProcessorPil(size={"shortest_edge": 224, "longest_edge": 224})
    return _save(out, GroundingDinoForObjectDetection(cfg), GroundingDinoProcessor(image_processor=ip, tokenizer=tok))


def owlv2(out: Path, tokens: Path) -> str:
    from transformers import Owlv2Config, Owlv2ForObjectDetection, Owlv2Processor
    from transformers.models.owlv2.image_processing_pil_owlv2 import Owlv2ImageProcessorPil

    tok = bpe_tokenizer(tokens / "bpe_eos", add_eos=True, max_length=16)
    cfg = Owlv2Config(
        text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=16, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=224, patch_size=32),
        projection_dim=32,
    )  # fmt: skip
    ip = Owlv2ImageProcessorPil(size={"height": 224, "width": 224})
    return _save(out, Owlv2ForObjectDetection(cfg), Owlv2Processor(image_processor=ip, tokenizer=tok))


def _dual_config(tok: Any) -> dict[str, Any]:
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=32, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id)  # fmt: skip
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=224,
                  patch_size=32)  # fmt: skip
    return {"text_config": text, "vision_config": vision}


def clip(out: Path, tokens: Path) -> str:
    from transformers import CLIPConfig, CLIPModel, CLIPProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tok = bpe_tokenizer(tokens / "bpe_eos", add_eos=True)
    model = CLIPModel(CLIPConfig(**_dual_config(tok), projection_dim=32))
    return _save(out, model, CLIPProcessor(image_processor=CLIPImageProcessorPil(), tokenizer=tok))


def siglip(out: Path, tokens: Path) -> str:
    from transformers import SiglipConfig, SiglipModel, SiglipProcessor
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    tok = bpe_tokenizer(tokens / "bpe_eos", add_eos=True)
    cfg = _dual_config(tok)
    cfg["text_config"]["projection_size"] = 32
    model = SiglipModel(SiglipConfig(**cfg))
    ip = SiglipImageProcessorPil(size={"height": 224, "width": 224})
    return _save(out, model, SiglipProcessor(image_processor=ip, tokenizer=tok))


def blip2(out: Path, tokens: Path, language_model: str = "llama") -> str:
    """BLIP-2 with a tiny Llama (decoder-only, like OPT) or T5 (encoder-decoder, like Flan-T5) LM."""
    from transformers import (
        Blip2Config,
        Blip2ForConditionalGeneration,
        Blip2Processor,
        Blip2QFormerConfig,
        Blip2VisionConfig,
        LlamaConfig,
        T5Config,
    )
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil

    tok = bpe_tokenizer(tokens / f"bpe_{language_model}", add_eos=language_model == "t5", max_length=64)
    nq = 4
    proc = Blip2Processor(image_processor=BlipImageProcessorPil(size={"height": 224, "width": 224}), tokenizer=tok,
                          num_query_tokens=nq)  # fmt: skip
    vocab = len(proc.tokenizer)  # the processor added the <image> token
    if language_model == "t5":
        text = T5Config(vocab_size=vocab, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
                        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                        decoder_start_token_id=tok.pad_token_id)  # fmt: skip
    else:
        text = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, bos_token_id=tok.bos_token_id,
                           eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip
    cfg = Blip2Config(
        vision_config=Blip2VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, image_size=224, patch_size=32),
        qformer_config=Blip2QFormerConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=64, encoder_hidden_size=32),
        text_config=text, num_query_tokens=nq,
        image_token_id=proc.tokenizer.convert_tokens_to_ids("<image>"),
    )  # fmt: skip
    return _save(out, Blip2ForConditionalGeneration(cfg), proc)


def dpt(out: Path, tokens: Path) -> str:
    from transformers import DPTConfig, DPTForDepthEstimation
    from transformers.models.dpt.image_processing_pil_dpt import DPTImageProcessorPil

    cfg = DPTConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64, image_size=224,
                    patch_size=16, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[16, 32, 64, 64],
                    fusion_hidden_size=32, head_in_index=-1)  # fmt: skip
    ip = DPTImageProcessorPil(size={"height": 224, "width": 224}, keep_aspect_ratio=False)
    return _save(out, DPTForDepthEstimation(cfg), ip)


def depth_anything(out: Path, tokens: Path) -> str:
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation, Dinov2Config
    from transformers.models.dpt.image_processing_pil_dpt import DPTImageProcessorPil

    bb = Dinov2Config(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
                      image_size=224, patch_size=14, out_indices=[1, 2, 3, 4], reshape_hidden_states=False,
                      apply_layernorm=True)  # fmt: skip
    cfg = DepthAnythingConfig(backbone_config=bb, patch_size=14, reassemble_hidden_size=32,
                              neck_hidden_sizes=[16, 32, 64, 64], fusion_hidden_size=32, head_hidden_size=16)  # fmt: skip
    # keep_aspect_ratio like the real Depth-Anything processor, so batches mix preprocessed shapes.
    ip = DPTImageProcessorPil(size={"height": 224, "width": 224}, keep_aspect_ratio=True, ensure_multiple_of=14)
    return _save(out, DepthAnythingForDepthEstimation(cfg), ip)


def causal_lm(out: Path, tokens: Path) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = bpe_tokenizer(tokens / "bpe_llama", add_eos=False, max_length=64)
    # hidden 64: bitsandbytes' CPU 4-bit kernels need in_features >= their block size (64).
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip
    return _save(out, LlamaForCausalLM(cfg), tok)


BUILDERS = {
    "grounding_dino": grounding_dino,
    "owlv2": owlv2,
    "clip": clip,
    "siglip": siglip,
    "blip2": blip2,
    "blip2_t5": lambda out, tokens: blip2(out, tokens, "t5"),
    "dpt": dpt,
    "depth_anything": depth_anything,
    "causal_lm": causal_lm,
}


def build(family: str, root: str | Path, seed: int = 0) -> str:
    """Build the tiny `family` checkpoint under `root/family` (reused if present); returns its path."""
    import torch

    root = Path(root)
    out = root / family
    if not (out / "config.json").exists():
        torch.manual_seed(seed)
        BUILDERS[family](out, root / "tokenizers")
    return str(out)
