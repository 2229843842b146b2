"""Sampling programs from a policy: the `Generator` protocol and the papers' sampling settings.

A `Generator` takes prompt texts (already built by `vprl.train.prompts`, not yet framed) and returns,
for each, `sampling.n` completions: the text the model wrote after the prompt, cut at the first
stop sequence. `vprl.train.prompts.completion_to_program` turns a completion into a program. The
transformers implementation (CPU or GPU) is `vprl.train.sampling.hf`; the vLLM one (GPU) is
`vprl.train.sampling.vllm_engine`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

from vprl.executor.tools.hf.sampling import SamplingSettings, sampling_fields
from vprl.train.prompts import STOP_SEQUENCES

__all__ = ["PAPER_SAMPLING", "Generator", "SamplingSettings", "cut_at_stop", "policy_sampling", "sampling_fields"]

# The papers' sampling of programs: temperature 1.0, top-p 0.9, 320 new tokens (docs/references.md).
PAPER_SAMPLING = SamplingSettings(temperature=1.0, top_p=0.9, max_new_tokens=320, stop=STOP_SEQUENCES)


def policy_sampling(**changes: Any) -> SamplingSettings:
    """The papers' program sampling with some settings changed (`n`, `seed`, `temperature`, ...)."""
    return dataclasses.replace(PAPER_SAMPLING, **changes)


class Generator(Protocol):
    def generate(self, prompts: Sequence[str], sampling: SamplingSettings) -> list[list[str]]:
        """`sampling.n` completions for each prompt, in prompt order."""
        ...


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """The text up to (not including) the earliest stop sequence."""
    end = len(text)
    for s in stop:
        i = text.find(s)
        if i != -1:
            end = min(end, i)
    return text[:end]
