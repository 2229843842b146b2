"""A stand-in for trl's `VLLMGeneration` that samples from the policy being trained, as a synced vLLM
engine would, and reports what vLLM reports: the token ids up to and including the token that
completes a stop string, the EOS or a stop token id, and each drawn token's *processed* log-probability
(`logprobs_mode="processed_logprobs"`, which trl sets): after temperature, min-p, top-k and top-p,
renormalised over the tokens kept.

Its filters are written from vLLM's sampler (temperature, then min-p, then top-k and top-p in one
sort), independently of `vprl.train.online.sampler_logprobs`, so a test comparing the two is not circular.
"""

from __future__ import annotations

import math

import torch


def vllm_filtered_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float):
    """One row of logits as vLLM's v1 sampler leaves them before it samples (-inf where filtered)."""
    logits = logits.float() / temperature
    if min_p > 0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.max(), -math.inf)
    ordered, index = logits.sort(descending=False)
    if top_k and top_k > 0:
        ordered = ordered.masked_fill(ordered < ordered[-top_k], -math.inf)
    if top_p < 1.0:
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative <= 1 - top_p
        drop[-1] = False
        ordered = ordered.masked_fill(drop, -math.inf)
    return torch.empty_like(logits).scatter(0, index, ordered)


class PolicyVLLMGeneration:
    """Patched over `trl.trainer.grpo_trainer.VLLMGeneration`; colocate mode (each process samples its
    own prompts, n=1 per prompt copy)."""

    instances: list = []

    def __init__(self, model, accelerator, processing_class, **kwargs):
        self.model, self.tokenizer, self.kwargs = model, processing_class, kwargs
        self.temperature = kwargs["temperature"]
        self.top_k = kwargs.get("top_k") or 0
        self.top_p = 1.0 if kwargs.get("top_p") is None else kwargs["top_p"]
        self.min_p = kwargs.get("min_p") or 0.0
        self.max_tokens = kwargs["max_completion_length"]
        self.stops = list((kwargs.get("generation_kwargs") or {}).get("stop") or [])
        # like vLLM, a stop token is kept as the completion's last token (stop strings' text is not)
        self.stop_ids = set((kwargs.get("generation_kwargs") or {}).get("stop_token_ids") or [])
        self.generator = torch.Generator().manual_seed(1234)
        self.calls, self.synced = 0, 0
        self.ended_at_stop: list[bool] = []  # per completion: a stop string ended it (not EOS or the limit)
        self.prompts: list[list[int]] = []
        self.completion_ids: list[list[int]] = []
        PolicyVLLMGeneration.instances.append(self)

    def sync_weights(self):
        self.synced += 1  # it samples from the live policy, which is what a synced engine holds

    @torch.no_grad()
    def _sample_one(self, prompt: list[int]) -> tuple[list[int], list[float], bool]:
        ids, logprobs = list(prompt), []
        eos = self.tokenizer.eos_token_id
        for _ in range(self.max_tokens):
            logits = self.model(input_ids=torch.tensor([ids])).logits[0, -1]
            filtered = vllm_filtered_logits(logits, self.temperature, self.top_k, self.top_p, self.min_p)
            logp = filtered.log_softmax(-1)
            token = int(torch.multinomial(logp.exp(), 1, generator=self.generator))
            ids.append(token)
            logprobs.append(float(logp[token]))
            if token == eos or token in self.stop_ids:
                return ids[len(prompt) :], logprobs, False
            text = self.tokenizer.decode(ids[len(prompt) :], skip_special_tokens=True)
            if any(stop in text for stop in self.stops):
                return ids[len(prompt) :], logprobs, True
        return ids[len(prompt) :], logprobs, False

    def generate(self, prompts, images, num_generations, profiler=None):
        self.calls += 1
        completions, logprobs = [], []
        for prompt in prompts:
            ids, lps, at_stop = self._sample_one(list(prompt))
            completions.append(ids)
            logprobs.append([[lp] for lp in lps])
            self.ended_at_stop.append(at_stop)
        self.prompts += [list(p) for p in prompts]
        self.completion_ids += completions
        return prompts, completions, logprobs, [[[t] for t in c] for c in completions]
