"""How long the recipe's own prompts are, in the policy's tokens, for the layout check's activations.

The prompts of one task share their API listing and in-context examples and differ by the question,
so the longest questions of each task (or mixture entry) give the longest prompts; only those are
built and measured. They are counted with the policy's tokenizer where it is on this machine (a local
folder or the hub cache; nothing is downloaded), else estimated from their characters.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from vprl.data.records import Example
from vprl.train.prompts import PromptConfig
from vprl.train.recipe.data import build_prompts
from vprl.train.recipe.mixture import entry_of

# Code LLM tokenizers take about 3.0-3.9 characters per token on the GQA prompt (its 9,840
# characters are 2,500-3,300 tokens); the low end makes the estimate err towards more memory.
CHARS_PER_TOKEN = 3.0
PER_TASK = 8  # the longest questions of each task whose prompts are measured


@dataclass(frozen=True)
class PromptLength:
    tokens: int
    how: str


def longest_prompts(examples: list[Example], configs: dict[str, PromptConfig]) -> list[str]:
    """The prompts of the `PER_TASK` longest questions of each task or mixture entry."""
    groups: dict[str, list[Example]] = defaultdict(list)
    for ex in examples:
        groups[entry_of(ex) or ex.task].append(ex)
    chosen = [ex for group in groups.values() for ex in sorted(group, key=lambda e: -len(e.query))[:PER_TASK]]
    return [p.prompt for p in build_prompts(chosen, configs)]


def measure(prompts: list[str], policy: str) -> PromptLength:
    """The longest of `prompts` in the policy's tokens: counted where its tokenizer is local, else estimated."""
    if not prompts:
        return PromptLength(0, "no prompts")
    tokenizer = _local_tokenizer(policy)
    if tokenizer is not None:
        return PromptLength(
            max(len(tokenizer(p)["input_ids"]) for p in prompts), "counted with the policy's tokenizer"
        )
    longest = max(map(len, prompts))
    return PromptLength(math.ceil(longest / CHARS_PER_TOKEN), f"estimated at {CHARS_PER_TOKEN:g} characters a token")


def _local_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError):
        return None
