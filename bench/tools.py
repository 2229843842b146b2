"""Throughput and peak memory of the hf tool backend: batched calls vs one call at a time.

    python bench/tools.py                       # tiny random models on CPU (< 2 min)
    python bench/tools.py --real-size --device cuda --dtype float16
                                                # real-size architectures, random weights (no downloads)

Every tool gets `--calls` distinct calls (one random image each, a random region), run once as one
`backend.run(tool, calls)` (batched up to `--batch-size`) and once call by call. Peak memory is the
CUDA allocator's peak on GPU and the sampled process RSS above the starting RSS on CPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOOLS = ("detect", "verify", "itm", "vqa", "caption", "depth", "llm")
TINY = {"detect": "grounding_dino", "verify": "clip", "itm": "clip", "vqa": "blip2_t5", "caption": "blip2_t5",
        "depth": "dpt", "llm": "causal_lm"}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS, help="tools to measure")
    p.add_argument("--calls", type=int, default=16, help="calls per tool (distinct images and regions)")
    p.add_argument("--batch-size", type=int, default=8, help="max_batch_size of every tool in batched mode")
    p.add_argument("--image-size", type=int, nargs=2, default=(240, 320), metavar=("H", "W"))
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--real-size", action="store_true", help="real-size architectures with random weights (GPU)")
    p.add_argument("--max-new-tokens", type=int, default=8, help="llm tokens per call")
    return p.parse_args(argv)


class PeakMemory:
    """Peak memory above the start, in MiB: CUDA allocator peak, or sampled RSS on CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def __enter__(self) -> PeakMemory:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            self.start = self.peak = _rss()
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: Any) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            self.mib = (torch.cuda.max_memory_allocated() - self.start) / 2**20
        else:
            self._stop.set()
            self._thread.join()
            self.mib = (max(self.peak, _rss()) - self.start) / 2**20


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_calls(tool: str, n: int, images: Any, size: tuple[int, int]) -> list[Any]:
    import numpy as np

    from vprl.executor.tools.calls import ToolCall

    rng = np.random.default_rng(0)
    height, width = size
    nouns = ["cat", "dog", "red car", "person", "table", "bird", "cup", "tree"]
    calls = []
    for i in range(n):
        if tool == "llm":
            calls.append(ToolCall("llm", None, None, {"prompt": f"Question {i}: is a {nouns[i % 8]} an animal?"}))
            continue
        ref = images.add_array(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).ref
        left, lower = int(rng.integers(0, width // 2)), int(rng.integers(0, height // 2))
        box = (left, lower, left + width // 2, lower + height // 2)
        args = {
            "detect": {"noun": nouns[i % 8], "threshold": None},
            "verify": {"object_name": nouns[i % 8], "property": "red"},
            "itm": {"texts": [f"a photo of a {w}" for w in nouns[:4]]},
            "vqa": {"question": f"what color is the {nouns[i % 8]}?"},
            "caption": {},
            "depth": {},
        }[tool]
        calls.append(ToolCall(tool, ref, box, args))
    return calls


def measure(backend: Any, tool: str, calls: list[Any], batched: bool, cuda: bool) -> tuple[float, float]:
    """(calls per second, peak MiB) of one pass."""
    import torch

    depth_model = None
    if tool == "depth":  # do not let one pass reuse the other pass's cached depth maps
        depth_model = backend._model("depth")
        depth_model.maps.clear()
    with PeakMemory(cuda) as mem:
        start = time.perf_counter()
        if batched:
            backend.run(tool, calls)
        else:
            for call in calls:
                backend.run(tool, [call])
        if cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    if depth_model is not None:
        depth_model.maps.clear()
    return len(calls) / elapsed, mem.mib


def tiny_config(tools: list[str], root: Path, args: argparse.Namespace) -> dict[str, Any]:
    from tests import tiny_models as tiny

    config: dict[str, Any] = {"device": args.device, "dtype": args.dtype}
    for tool in tools:
        config[tool] = {"model": tiny.build(TINY[tool], root), "max_batch_size": args.batch_size}
    if "llm" in config:
        config["llm"]["max_new_tokens"] = args.max_new_tokens
    return config


def install_real_size(backend: Any, tools: list[str], root: Path) -> None:
    """Replace each tool's model with a real-size architecture (random weights) and a real-size processor.

    GroundingDINO base (Swin-B, BERT-base, 800px; it stands for both detectors), CLIP ViT-L/14-336, BLIP-2 (ViT-g + Q-Former) with OPT-125m-size LM, DPT-Large and
    a 1B-size Llama. Speed does not depend on the weights, so no download is needed.
    """
    import torch
    import transformers as tf
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.dpt.image_processing_pil_dpt import DPTImageProcessorPil
    from transformers.models.grounding_dino.image_processing_pil_grounding_dino import GroundingDinoImageProcessorPil

    from tests import tiny_models as tiny
    from vprl.executor.tools.hf import depth, detection, llm, matching, vqa
    from vprl.executor.tools.hf.loading import resolve_device, torch_dtype

    bert = tiny.wordpiece_tokenizer(root / "tok_wp")
    bpe = tiny.bpe_tokenizer(root / "tok_bpe", add_eos=True, max_length=77)
    lm_tok = tiny.bpe_tokenizer(root / "tok_lm", add_eos=False, max_length=512)

    def place(model: Any, tool: str) -> Any:
        placement = backend.tools[tool].placement(backend.defaults)
        return model.to(resolve_device(placement.device), torch_dtype(placement.dtype)).eval(), placement

    built: dict[str, Any] = {}
    for tool in tools:
        torch.manual_seed(0)
        if tool == "detect":
            swin_b = tf.SwinConfig(embed_dim=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32], window_size=12,
                                   image_size=384, out_features=["stage2", "stage3", "stage4"])  # fmt: skip
            cfg = tf.GroundingDinoConfig(
                backbone_config=swin_b, text_config=tf.BertConfig(), disable_custom_kernels=True
            )
            proc = tf.GroundingDinoProcessor(image_processor=GroundingDinoImageProcessorPil(), tokenizer=bert)
            model, placement = place(tf.GroundingDinoForObjectDetection(cfg), tool)
            obj, kind = detection.Detector("grounding-dino", model, proc), "detector"
        elif tool in ("verify", "itm"):
            if "matcher" not in built:
                cfg = tf.CLIPConfig(
                    text_config=dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=12,
                                     max_position_embeddings=77, bos_token_id=bpe.bos_token_id, eos_token_id=bpe.eos_token_id,
                                     pad_token_id=bpe.pad_token_id),
                    vision_config=dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16,
                                       num_hidden_layers=24, image_size=336, patch_size=14),
                    projection_dim=768,
                )  # fmt: skip
                ip = CLIPImageProcessorPil(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
                built["matcher"] = place(tf.CLIPModel(cfg), tool)
                built["matcher_proc"] = tf.CLIPProcessor(image_processor=ip, tokenizer=bpe)
            model, placement = built["matcher"]
            obj, kind = matching.Matcher("clip", model, built["matcher_proc"]), "matcher"
        elif tool in ("vqa", "caption"):
            if "captioner" not in built:
                proc = tf.Blip2Processor(image_processor=BlipImageProcessorPil(size={"height": 224, "width": 224}),
                                         tokenizer=tiny.bpe_tokenizer(root / "tok_blip", add_eos=False),
                                         num_query_tokens=32)  # fmt: skip
                text = tf.OPTConfig(bos_token_id=proc.tokenizer.bos_token_id, eos_token_id=proc.tokenizer.eos_token_id,
                                    pad_token_id=proc.tokenizer.pad_token_id)  # fmt: skip
                cfg = tf.Blip2Config(text_config=text, num_query_tokens=32,
                                     image_token_id=proc.tokenizer.convert_tokens_to_ids("<image>"))  # fmt: skip
                proc.tokenizer.padding_side = "left"
                built["captioner"] = (place(tf.Blip2ForConditionalGeneration(cfg), tool), proc)
            (model, placement), proc = built["captioner"]
            obj, kind = vqa.Captioner(model, proc), "captioner"
        elif tool == "depth":
            cfg = tf.DPTConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                               image_size=384, backbone_out_indices=[5, 11, 17, 23],
                               neck_hidden_sizes=[256, 512, 1024, 1024])  # fmt: skip
            ip = DPTImageProcessorPil(size={"height": 384, "width": 384}, keep_aspect_ratio=False)
            model, placement = place(tf.DPTForDepthEstimation(cfg), tool)
            obj, kind = depth.DepthModel(model, ip), "depth"
        else:
            cfg = tf.LlamaConfig(vocab_size=len(lm_tok), hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                 num_attention_heads=32, num_key_value_heads=8, bos_token_id=lm_tok.bos_token_id,
                                 eos_token_id=lm_tok.eos_token_id, pad_token_id=lm_tok.pad_token_id)  # fmt: skip
            model, placement = place(tf.LlamaForCausalLM(cfg), tool)
            obj, kind = llm.TextModel("transformers", model, lm_tok), "llm-transformers"
        backend.models.put(kind, backend.tools[tool].model, placement, obj)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    from vprl.executor.tools.hf import HFBackend
    from vprl.executor.tools.images import ImageStore

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.real_size:
            config = tiny_config(args.tools, root, args)  # paths only; models replaced in memory below
            backend = HFBackend(ImageStore(), **config)
            install_real_size(backend, args.tools, root / "real")
        else:
            backend = HFBackend(ImageStore(), **tiny_config(args.tools, root, args))
        rows = []
        for tool in args.tools:
            calls = make_calls(tool, args.calls, backend.images, tuple(args.image_size))
            backend.run(tool, calls[:2])  # load + warm up
            seq_rate, seq_mem = measure(backend, tool, calls, batched=False, cuda=cuda)
            bat_rate, bat_mem = measure(backend, tool, calls, batched=True, cuda=cuda)
            rows.append((tool, seq_rate, bat_rate, seq_mem, bat_mem))
            print(f"  {tool}: done", file=sys.stderr, flush=True)
    kind = "real-size" if args.real_size else "tiny"
    print(f"\nhf backend, {kind} models, {'cuda' if cuda else 'cpu'} {args.dtype}, {args.calls} calls/tool, "
          f"batch {args.batch_size}, images {args.image_size[0]}x{args.image_size[1]}")  # fmt: skip
    header = f"{'tool':<8} {'1-by-1 calls/s':>15} {'batched calls/s':>16} {'speedup':>8} {'1-by-1 MiB':>11} {'batched MiB':>12} {'mem ratio':>10}"
    print(header)
    print("-" * len(header))
    for tool, seq_rate, bat_rate, seq_mem, bat_mem in rows:
        ratio = f"{bat_mem / seq_mem:.2f}" if seq_mem > 0.5 else "-"
        print(
            f"{tool:<8} {seq_rate:>15.1f} {bat_rate:>16.1f} {bat_rate / seq_rate:>7.2f}x {seq_mem:>11.1f} {bat_mem:>12.1f} {ratio:>10}"
        )


if __name__ == "__main__":
    main()
