"""Shared pieces of the evaluation tests: a small shapes world and a scripted policy.

`ScriptedPolicy` is a `vprl.train.sampling.generator.Generator` test double standing in for "a policy that
makes mistakes": for each prompt it writes the shapes world's gold program (`load_gold_programs`)
or a plausible wrong one (`vprl.data.shapes.mutations.mutate`, a crash, or a too-tight crop). That is
legitimate for testing the inference modes, which only ever see programs, never how they were
produced; it lets the tests know the quality of each program a mode picks from. A real policy
(the tiny Llama) drives the end-to-end CLI test.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
from vprl.data.shapes.mutations import mutate
from vprl.train.sampling.generator import SamplingSettings

MISTAKES = ("mutant", "crash", "tight_crop")
# The gold line `obj = image_patch.find("X")[0]` of the single-object families.
_FIND_FIRST = re.compile(r'^(\s*)obj = image_patch\.find\("([^"]+)"\)\[0\]$', re.M)


def build_world(root, val: int = 24, seed: int = 3) -> None:
    build_dataset(BuildConfig(out=str(root), train=10, val=val, seed=seed, winoground=4, sugarcrepe=2, refcoco=4))


def all_gold(root) -> dict[str, str]:
    """{query: gold program} over every task of a world."""
    return {q: p for programs in load_gold_programs(root).values() for q, p in programs.items()}


def prompt_query(prompt: str) -> str:
    """The query of a prompt: the comment line right above the final signature."""
    lines = prompt.rstrip().split("\n")
    if not lines[-1].startswith("def execute_command") or not lines[-2].startswith("# "):
        raise AssertionError(f"unexpected prompt tail: {lines[-2:]}")
    return lines[-2][2:]


def _unit(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 2**32


def crash(program: str) -> str:
    """A runtime error: the image argument misnamed (NameError)."""
    return program.replace("ImagePatch(image)", "ImagePatch(img)")


def tight_crop(program: str) -> str | None:
    """Look for the object again inside a crop of its left 40%: nothing is found at the default
    visibility threshold (0.5), it is at a lowered one (self-tuning). None when the program has no
    `obj = image_patch.find(...)[0]` line."""
    m = _FIND_FIRST.search(program)
    if m is None:
        return None
    pad, noun = m.group(1), m.group(2)
    lines = (
        f'{pad}whole = image_patch.find("{noun}")[0]\n'
        f"{pad}part = image_patch.crop(whole.left, whole.lower, whole.left + (whole.right - whole.left) * 2 // 5, "
        f"whole.upper)\n"
        f'{pad}obj = part.find("{noun}")[0]'
    )
    return program[: m.start()] + lines + program[m.end() :]


@dataclass
class ScriptedPolicy:
    """Writes, per query: the gold program, or (for a `wrong_share` of queries, fixed by a hash of
    the query) a mistake when decoding greedily. Sampling (temperature > 0) writes a mistaken
    query's gold in `gold_in_samples` of the samples and mutants otherwise. A prompt that shows a
    previous attempt (self-debugging, re-prompting) gets the gold when `fix_on_feedback`.
    """

    gold: dict[str, str]
    wrong_share: float = 0.6
    mistake: str = "mutant"
    gold_in_samples: float = 0.34
    fix_on_feedback: bool = True
    calls: list[tuple[int, float, int, int]] = field(default_factory=list)  # (prompts, temp, n, with previous)
    prompts: list[str] = field(default_factory=list)  # every prompt seen, in order

    def __post_init__(self) -> None:
        if self.mistake not in MISTAKES:
            raise ValueError(f"mistake {self.mistake!r} is not one of {MISTAKES}")

    def mistaken(self, query: str) -> bool:
        return _unit(query) < self.wrong_share

    def mutants(self, query: str) -> list[str]:
        return [m.program for m in mutate(self.gold[query])] or [crash(self.gold[query])]

    def wrong(self, query: str, k: int) -> str:
        gold = self.gold[query]
        if self.mistake == "crash":
            return crash(gold)
        if self.mistake == "tight_crop":
            return tight_crop(gold) or gold
        mutants = self.mutants(query)
        return mutants[k % len(mutants)]

    def write(self, prompt: str, k: int, sampling: SamplingSettings) -> str:
        query = prompt_query(prompt)
        if query not in self.gold:
            raise AssertionError(f"no gold program for {query!r}")
        if "An earlier attempt at this query:" in prompt and self.fix_on_feedback:
            return self.gold[query]
        if not self.mistaken(query):
            return self.gold[query]
        if sampling.temperature == 0:
            return self.wrong(query, 0)
        draw = _unit(f"{query}|{sampling.seed}|{k}")
        return self.gold[query] if draw < self.gold_in_samples else self.wrong(query, k)

    def generate(self, prompts: Sequence[str], sampling: SamplingSettings) -> list[list[str]]:
        n = sampling.n
        with_previous = sum("An earlier attempt at this query:" in p for p in prompts)
        self.calls.append((len(prompts), sampling.temperature, n, with_previous))
        self.prompts += list(prompts)
        return [[self.write(p, k, sampling) for k in range(n)] for p in prompts]


def build_tiny_llama(out, world, context: int = 256, adapter_out=None) -> str:
    """A random tiny Llama with a tokenizer trained on the world's bare prompts and gold programs
    (vprl.train.policy.tiny), saved to `out`; with `adapter_out`, also a fresh LoRA adapter on it."""
    from vprl.train.policy.tiny import TinyModelConfig, build_model, train_tokenizer
    from vprl.train.prompts import PromptConfig, PromptTemplate

    template = PromptTemplate.from_config(PromptConfig(layout="bare"))
    texts = [template.build(q) + "\n" + p for q, p in all_gold(world).items()]
    tokenizer = train_tokenizer(texts, vocab_size=400, context=context)
    sizes = TinyModelConfig(
        vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, context=context
    )
    model = build_model(tokenizer, sizes)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    if adapter_out is not None:
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(str(out))
        lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        lora.save_pretrained(str(adapter_out))
    return str(out)
