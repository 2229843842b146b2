"""Sampled text generation for the LLM test writer and the layout planner: n replies per prompt.

Two backends share one call, `generate(prompts, sampling) -> [[reply] * n per prompt]`:

- `HFBackend`: a transformers causal LM, left-padded batched `generate` with
  `num_return_sequences=n` (greedy when `temperature == 0`, which gives one reply per prompt);
- `VllmBackend`: vLLM's offline engine (`vllm.LLM`), imported on first use. The engine can be
  passed in, so a test drives the code path with a fake engine on a CPU. vLLM puts an engine it
  starts on the first visible GPU, so one is refused in a process whose GPU is another
  (`vprl/executor/tools/devices.py`; the layout check refuses the recipe first).

Both wrap each prompt as one user turn when the tokenizer has a chat template (instruction-tuned
models expect it) and sample from a seeded generator so a run is reproducible.
"""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol

from tqdm.auto import tqdm

from vprl.executor.tools.devices import vllm_refusal
from vprl.executor.tools.hf.loading import Placement, from_pretrained, input_device, resolve_device
from vprl.executor.tools.hf.sampling import SamplingSettings, sampling_fields

BACKENDS = ("transformers", "vllm", "server")


def sampling_of(config: Any, stop: tuple[str, ...]) -> SamplingSettings:
    """The sampling part of a writer's or planner's flat config: `num_candidates` replies per prompt,
    the other fields by their `SamplingSettings` names."""
    return SamplingSettings(**sampling_fields(config), n=config.num_candidates, stop=stop)


@dataclass(frozen=True)
class BackendSettings:
    """Where the text model runs. The writer's and the planner's configs extend this (flat YAML)."""

    model: str = ""  # checkpoint path or hub id
    backend: str = "transformers"  # or "vllm" (GPU), or "server" (an OpenAI-compatible server: `vllm serve`)
    device: str = "auto"  # auto and cuda: this training process's GPU (vprl/executor/tools/devices.py)
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU (vLLM: its own "auto")
    quantization: str = "none"  # transformers only: none | 8bit | 4bit
    chat_template: bool = True
    batch_size: int = 4  # prompts per transformers `generate` call
    gpu_memory_utilization: float = 0.5  # vLLM only
    base_url: str = ""  # server only: e.g. http://host:8000/v1
    timeout_s: float = 300.0  # server only: one request

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("`model` is required: a checkpoint path or hub id")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.backend == "server" and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"backend server needs base_url, the server's http(s)://host:port/v1, got {self.base_url!r}"
            )

    @classmethod
    def from_dict(cls, settings: dict[str, Any], where: str = "settings"):
        """Build from a YAML mapping; unknown keys fail with the list of valid ones."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(settings) - set(names))
        if unknown:
            raise ValueError(f"{where}: unknown setting(s) {unknown}; valid settings: {names}")
        return cls(**settings)

    def placement(self) -> Placement:
        device = resolve_device(self.device)
        dtype = self.dtype
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        return Placement(device=device, dtype=dtype, quantization=self.quantization)


@dataclass(frozen=True)
class SampledBackendSettings(BackendSettings):
    """`BackendSettings` plus how replies are sampled, flat (the writer's and the planner's configs).

    A config sets its own defaults by declaring a field again (a dataclass keeps the field where the
    base put it), and its stop strings in `STOP`.
    """

    STOP: ClassVar[tuple[str, ...]] = ()

    num_candidates: int = 1
    temperature: float = 1.0
    top_p: float = 0.9
    top_k: int = 0
    max_new_tokens: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        _ = self.sampling  # its own checks name the bad sampling field

    @property
    def sampling(self) -> SamplingSettings:
        return sampling_of(self, stop=self.STOP)


class TextBackend(Protocol):
    def generate(self, prompts: Sequence[str], sampling: SamplingSettings) -> list[list[str]]: ...


def as_user_turn(tokenizer: Any, prompt: str, enabled: bool) -> str:
    if enabled and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    return prompt


def prompt_token_ids(tokenizer: Any, prompts: Sequence[str], chat_template: bool) -> list[list[int]]:
    """Each prompt as token ids, encoded as the transformers backend encodes them. Handed text, a
    server tokenizes it with special tokens, and a rendered chat template already starts with its
    BOS (two BOS); ids leave nothing to add."""
    templated = chat_template and getattr(tokenizer, "chat_template", None)
    return [
        list(tokenizer(as_user_turn(tokenizer, p, chat_template), add_special_tokens=not templated)["input_ids"])
        for p in prompts
    ]


@contextlib.contextmanager
def seeded(seed: int, device: Any) -> Iterator[None]:
    """Seed torch's RNG for one generate call without disturbing the caller's random state."""
    import torch

    cuda = [device] if getattr(device, "type", str(device)).startswith("cuda") else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        yield


class HFBackend:
    def __init__(self, settings: BackendSettings, model: Any = None, tokenizer: Any = None) -> None:
        self.settings = settings
        self._model, self._tokenizer = model, tokenizer

    def _load(self) -> None:
        if self._model is not None:
            return
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.settings.model, padding_side="left")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token  # batched generate needs one; it is masked out
        self._model = from_pretrained(AutoModelForCausalLM, self.settings.model, self.settings.placement())
        self._tokenizer = tokenizer

    def generate(self, prompts: Sequence[str], sampling: SamplingSettings) -> list[list[str]]:
        import torch

        self._load()
        tok, model = self._tokenizer, self._model
        templated = self.settings.chat_template and getattr(tok, "chat_template", None)
        texts = [as_user_turn(tok, p, self.settings.chat_template) for p in prompts]
        size = self.settings.batch_size
        n = 1 if sampling.greedy else sampling.n  # greedy replies would all be the same
        kwargs: dict[str, Any] = dict(max_new_tokens=sampling.max_new_tokens, pad_token_id=tok.pad_token_id)
        if sampling.greedy:
            kwargs.update(do_sample=False)
        else:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
            kwargs.update(num_return_sequences=n)
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=tok)
        replies: list[list[str]] = []
        starts = range(0, len(texts), size)
        for i, start in enumerate(tqdm(starts, desc="llm generate", disable=len(starts) < 2)):
            batch = texts[start : start + size]
            # A rendered chat template already carries the BOS token; adding it again would double it.
            inputs = tok(batch, return_tensors="pt", padding=True, add_special_tokens=not templated)
            inputs = inputs.to(input_device(model))
            with torch.inference_mode(), seeded((sampling.seed or 0) + i, input_device(model)):
                out = model.generate(**inputs, **kwargs)
            decoded = tok.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
            replies.extend(decoded[j * n : (j + 1) * n] for j in range(len(batch)))
        return replies


class VllmBackend:
    def __init__(self, settings: BackendSettings, engine: Any = None) -> None:
        self.settings = settings
        self._engine = engine

    @property
    def engine(self) -> Any:
        if self._engine is None:
            try:
                from vllm import LLM
            except ImportError as exc:
                raise RuntimeError(
                    "backend 'vllm' needs vllm installed (pip install 'vprl[vllm]', GPU only); "
                    "use backend: transformers on a CPU"
                ) from exc
            if self.settings.quantization != "none":
                raise ValueError("quantization is a transformers-backend setting; vLLM reads it from the checkpoint")
            refusal = vllm_refusal(
                resolve_device(self.settings.device),
                f"{self.settings.model} (backend: vllm)",
                "serve it once for every process (backend: server) or write the tests first "
                "(python -m vprl.train.prepare_unit_tests)",
            )
            if refusal:
                raise RuntimeError(refusal)
            self._engine = LLM(
                model=self.settings.model,
                dtype=self.settings.dtype,
                gpu_memory_utilization=self.settings.gpu_memory_utilization,
            )
        return self._engine

    def generate(self, prompts: Sequence[str], sampling: SamplingSettings) -> list[list[str]]:
        from vllm import SamplingParams

        engine = self.engine
        ids = prompt_token_ids(engine.get_tokenizer(), prompts, self.settings.chat_template)
        token_prompts = [{"prompt_token_ids": one} for one in ids]
        params = SamplingParams(
            n=1 if sampling.greedy else sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_tokens=sampling.max_new_tokens,
            seed=sampling.seed,
            stop=list(sampling.stop) or None,
        )
        outputs = engine.generate(token_prompts, params, use_tqdm=len(prompts) > 1)
        return [[c.text for c in out.outputs] for out in outputs]


class ServerBackend:
    """A served model behind an OpenAI-compatible completions endpoint (`vllm serve <model>`, one per
    cluster, shared by every training process). Prompts go as token ids encoded here, as the other
    backends encode them, so the server adds no BOS of its own."""

    def __init__(self, settings: BackendSettings, tokenizer: Any = None) -> None:
        self.settings = settings
        self._tokenizer = tokenizer

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.settings.model)
        return self._tokenizer

    def generate(self, prompts: Sequence[str], sampling: SamplingSettings) -> list[list[str]]:
        ids = prompt_token_ids(self.tokenizer, prompts, self.settings.chat_template)
        n = 1 if sampling.greedy else sampling.n
        body = {
            "model": self.settings.model,
            "prompt": ids,
            "n": n,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_new_tokens,
            "stop": list(sampling.stop) or None,
            **({"seed": sampling.seed} if sampling.seed is not None else {}),
            **({"top_k": sampling.top_k} if sampling.top_k else {}),
        }
        url = self.settings.base_url.rstrip("/") + "/completions"
        request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout_s) as response:
                choices = json.loads(response.read())["choices"]
        except (OSError, ValueError, KeyError) as exc:
            raise RuntimeError(f"text server {url}: {type(exc).__name__}: {exc}") from None
        replies: list[list[str]] = [[] for _ in prompts]
        for choice in sorted(choices, key=lambda c: c["index"]):
            replies[choice["index"] // n].append(choice["text"])
        return replies


def build_text_backend(settings: BackendSettings, engine: Any = None) -> TextBackend:
    if settings.backend == "server":
        return ServerBackend(settings)
    if settings.backend == "vllm":
        return VllmBackend(settings, engine=engine)
    if engine is not None:
        raise ValueError("`engine` is a vLLM engine; it needs backend: vllm")
    return HFBackend(settings)
