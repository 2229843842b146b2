"""Assemble a prompt from the API listing, in-context examples, instruction, guidelines, an optional
self-debugging block, an optional context comment and the query.

Slot order (Stanić et al., App. A.4): listing -> examples -> instruction -> guidelines -> previous
code and error -> context -> `# <query>` -> `def execute_command(...) -> T:`. The model continues
right after the signature. Everything before the per-query part is rendered once per config
(`PromptTemplate.static`), hashed for run manifests (`prompt_hash`), and is a shared prefix of
every prompt (so prefix caching in the generator applies).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from vprl.executor.api.spec import get_variant
from vprl.train.prompts.examples import ExampleSet, comment, load_examples, render_examples
from vprl.train.prompts.prompt_config import PromptConfig
from vprl.train.prompts.render import render_api

GUIDELINES_HEADER = "Consider the following guidelines:"

# Guidelines that depend on what the task's answer is, added after the variant's own.
TASK_GUIDELINES: dict[str, tuple[str, ...]] = {
    "vqa": ("Return the answer as a short string.",),
    "itm": ('Return "yes" if the image matches the text and "no" otherwise.',),
    "grounding": ("Always return an ImagePatch, and make sure every possible control flow returns an ImagePatch.",),
    "video_qa": ("Return one of the possible answers.",),
}


@dataclass(frozen=True)
class PreviousAttempt:
    """A failed program to show the model for self-debugging. `query` defaults to the current query."""

    program: str
    error: str
    query: str | None = None

    def to_json(self) -> dict:
        return {"program": self.program, "error": self.error, "query": self.query}

    @classmethod
    def from_json(cls, row: dict) -> PreviousAttempt:
        return cls(program=row["program"], error=row["error"], query=row.get("query"))


@dataclass(frozen=True)
class PromptTemplate:
    """The static part of a prompt, rendered once; `build` adds the per-query part."""

    config: PromptConfig
    static: str
    examples: ExampleSet

    @classmethod
    def from_config(cls, config: PromptConfig) -> PromptTemplate:
        spec = get_variant(config.variant)
        examples = load_examples(config.ice_file, config.max_ices)
        listing = render_api(spec)
        instruction = instruction_for(spec.classes[0][0] if spec.classes else None)
        guidelines = ""
        if config.include_guidelines:
            bullets = list(spec.guidelines) + [g for g in TASK_GUIDELINES[config.task] if g not in spec.guidelines]
            guidelines = "\n".join([GUIDELINES_HEADER, *(f"- {b}" for b in bullets)])
        if config.layout == "bare":
            parts = []
        elif config.layout == "stanic":
            parts = [listing, render_examples(examples.examples), instruction, guidelines]
        else:  # viunit: instructions first, then the examples under their own header
            shown = [f"{comment(f'Query: {ex.query}')}\nProgram:\n{ex.program}" for ex in examples.examples]
            header = "# Examples of how to use the API" if shown else ""
            parts = [listing, instruction, guidelines, header, "\n".join(shown)]
        static = "\n\n".join(p.strip("\n") for p in parts if p.strip())
        static = static + "\n" if static else ""
        return cls(config=config, static=static, examples=examples)

    @property
    def hash(self) -> str:
        """Content hash of everything static (listing, examples, instruction, guidelines, signature)."""
        text = self.static + "\n" + self.config.signature
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def build(self, query: str, *, previous: PreviousAttempt | None = None, context: str | None = None) -> str:
        if not isinstance(query, str) or not query.strip():
            raise ValueError(f"the query must be a non-empty string, got {query!r:.60}")
        blocks = [self.static]
        if previous is not None:
            blocks.append(previous_block(previous, query))
        tail = []
        if context is not None and context.strip():
            tail.append(comment(f"Context: {context.strip()}"))
        if self.config.layout in ("stanic", "bare"):
            tail.append(comment(query))
        else:
            tail += [comment(f"Query: {query.strip()}"), "Program:"]
        tail.append(self.config.signature)
        blocks.append("\n".join(tail))
        return "\n\n".join(b.strip("\n") for b in blocks if b.strip())


def instruction_for(class_name: str | None) -> str:
    what = f"the `{class_name}` class and the functions above" if class_name else "the functions above"
    return (
        f"Using {what}, write a Python function `execute_command` that can be executed to answer the "
        "query written in the comment just before it."
    )


def previous_block(previous: PreviousAttempt, query: str) -> str:
    """The self-debugging block: the query, the failing program, its error, and a request to fix it."""
    program = previous.program.strip("\n")
    error = previous.error.strip() or "(no error message)"
    return "\n".join(
        [
            "An earlier attempt at this query:",
            comment(previous.query or query),
            program,
            "failed when it was executed, with this error:",
            comment(error),
            "Correct the function so that it executes without errors and still answers the same query.",
        ]
    )


def build_prompt(
    query: str, config: PromptConfig, *, previous: PreviousAttempt | None = None, context: str | None = None
) -> str:
    """One prompt. Rendering the static part is repeated on every call: use
    `PromptTemplate.from_config(config).build(...)` when building many."""
    return PromptTemplate.from_config(config).build(query, previous=previous, context=context)


def prompt_hash(config: PromptConfig) -> str:
    """16 hex characters identifying the static prompt (changes when any docstring or example does)."""
    return PromptTemplate.from_config(config).hash
