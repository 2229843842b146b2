"""Text embedders for the verifiers: choosing opposites and comparing captions with statements.

`build_embedder(spec)`:

- `"hashing"` (default): bag of words and character trigrams hashed into buckets; no model, CPU.
- `"clip:<path>"`: CLIP's (or SigLIP's) text tower, `get_text_features` (ExoViP picks opposites
  with CLIP text embeddings).
- `"mean:<path>"`: any transformers encoder, mean-pooled over tokens (a Sentence-BERT checkpoint
  is a BERT with mean pooling; ExoViP compares captions with Sentence-BERT).

Add `@cuda` (or any torch device) to place the model: `"mean:sentence-transformers/all-MiniLM-L6-v2@cuda"`;
`cuda` and `auto` mean this training process's GPU (`vprl/executor/tools/devices.py`), the CPU is the default.
Vectors are L2-normalised, so a dot product is the cosine similarity.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vprl.executor.tools.hf.loading import resolve_device
from vprl.rewards.unit_tests.sampler import Embedder, hashing_embedder

KINDS = ("hashing", "clip", "mean")


def build_embedder(spec: str = "hashing", batch_size: int = 64) -> Embedder:
    kind, _, rest = spec.partition(":")
    if kind not in KINDS or (kind == "hashing") != (rest == ""):
        raise ValueError(f"embedder {spec!r}: use 'hashing', 'clip:<path>[@device]' or 'mean:<path>[@device]'")
    if kind == "hashing":
        return hashing_embedder()
    path, _, device = rest.partition("@")
    return _TransformersEmbedder(kind, path, resolve_device(device or "cpu"), batch_size)


class _TransformersEmbedder:
    def __init__(self, kind: str, path: str, device: str, batch_size: int) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.kind, self.device, self.batch_size = kind, device, batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).to(device).eval()
        self._cache: dict[str, np.ndarray] = {}

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        todo = sorted({t for t in texts if t not in self._cache})
        for start in range(0, len(todo), self.batch_size):
            batch = todo[start : start + self.batch_size]
            for text, vec in zip(batch, self._encode(batch)):
                self._cache[text] = vec
        return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, 1))

    def _encode(self, texts: list[str]) -> np.ndarray:
        import torch

        inputs = self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True).to(self.device)
        with torch.inference_mode():
            if self.kind == "clip":
                out = self.model.get_text_features(**inputs)
                feats = out.pooler_output if hasattr(out, "pooler_output") else out
            else:
                hidden = self.model(**inputs).last_hidden_state
                mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                feats = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        feats = feats.float()
        return (feats / feats.norm(dim=-1, keepdim=True).clamp(min=1e-12)).cpu().numpy().astype(np.float64)
