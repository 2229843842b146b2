"""What `tests/vllm_cpu_driver.py` measures on the real engine: log-probabilities of the engine and of
the trained model on one sequence, after every weight sync and per served adapter; how each
completion of trl's vLLM generation ended; processes left behind; a server's readiness. Measures
only: the verdicts are tests/test_vllm_cpu_engine.py's."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def model_logprobs(model: Any, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1 under `model`, dropout off."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    finally:
        model.train(was_training)
    return logits.log_softmax(-1).gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1).tolist()


def engine_logprobs(llm: Any, ids: list[int], lora_request: Any = None) -> list[float]:
    """The engine's log p(ids[i] | ids[:i]) for i >= 1 (its prompt log-probabilities)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    (out,) = llm.generate([{"prompt_token_ids": ids}], params, lora_request=lora_request, use_tqdm=False)
    return [entry[token].logprob for entry, token in zip(out.prompt_logprobs[1:], ids[1:], strict=True)]


def max_difference(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


class SyncProbe:
    """After every weight sync of the CPU adapter: the largest difference between the engine's and the
    trained model's log-probabilities on a fixed sequence (a prompt and its gold program)."""

    def __init__(self, ids: list[int]):
        self.ids, self.differences = ids, []

    def install(self):
        import vprl.train.online.vllm_cpu as vllm_cpu

        original = vllm_cpu._sync_by_reload
        probe = self

        def measured(self_generation):
            original(self_generation)
            llm, model = self_generation.llm, self_generation.model
            probe.differences.append(max_difference(engine_logprobs(llm, probe.ids), model_logprobs(model, probe.ids)))

        vllm_cpu._sync_by_reload = measured
        return original

    @staticmethod
    def remove(original):
        import vprl.train.online.vllm_cpu as vllm_cpu

        vllm_cpu._sync_by_reload = original


class EndingsProbe:
    """How each completion trl's vLLM generation returned ended: eos, stop (a stop string, tokens
    included, as vLLM returns them), or length (the limit) — one list per generate call."""

    def __init__(self, tokenizer: Any, stops: list[str], limit: int):
        self.tokenizer, self.stops, self.limit, self.calls = tokenizer, stops, limit, []

    def ending(self, ids: list[int]) -> str:
        if ids and ids[-1] == self.tokenizer.eos_token_id:
            return "eos"
        if any(s in self.tokenizer.decode(ids, skip_special_tokens=True) for s in self.stops):
            return "stop"
        return "length" if len(ids) >= self.limit else "other"

    def install(self):
        from trl.generation.vllm_generation import VLLMGeneration

        original = VLLMGeneration.generate
        probe = self

        def recorded(self_generation, prompts, images, num_generations, profiler=None):
            out = original(self_generation, prompts, images, num_generations, profiler)
            probe.calls.append([probe.ending(list(c)) for c in out[1]])
            return out

        VLLMGeneration.generate = recorded
        return original

    @staticmethod
    def remove(original):
        from trl.generation.vllm_generation import VLLMGeneration

        VLLMGeneration.generate = original


def adapter_logprobs(policy: Path, adapter: str | None, ids: list[int]) -> list[float]:
    """The trained model's log-probabilities with a saved adapter (none: the base)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(policy), dtype="float32")
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    return model_logprobs(model, ids)


def processes_left(before: set[int], wait_s: float = 30.0) -> list[str]:
    """This process's children that were not there `before`, once they had `wait_s` to exit (an engine's
    core process exits shortly after its shutdown). multiprocessing's resource tracker stays by design."""
    import psutil

    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for child in psutil.Process().children(recursive=True):
            try:
                if child.pid not in before and child.status() != psutil.STATUS_ZOMBIE:
                    command = " ".join(child.cmdline())
                    if "resource_tracker" not in command:
                        left.append(f"{child.name()}: {command[:200]}")
            except psutil.NoSuchProcess:
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1)


def wait_until_healthy(server: Any, url: str, log: Path, wait_s: float = 300) -> None:
    """Until the server answers; a server that exits is reported at once with its log's end."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited ({server.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(1)
    raise RuntimeError(f"the server did not answer in {wait_s:.0f} s:\n{log.read_text()[-3000:]}")
