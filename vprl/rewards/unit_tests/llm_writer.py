"""The LLM test writer ("llm"): ViUniT's candidate unit tests from a language model ([U] §D,
docs/references.md#unit-test-candidates).

For each query the model sees a few-shot prompt and samples `num_candidates` replies (ViUniT: 3,
temperature 0.7, top-p 0.9, 512 new tokens). Two prompts, as in ViUniT:

- `prompt: query` — the query alone; the examples are VQA questions (`task: vqa`) or "Is the
  drawing of ...?" image-text matching queries with near-miss negatives (`task: itm`);
- `prompt: query_program` — the query and one candidate program, so the tests probe its branches.

Each reply is parsed (`parsing.parse_tests`: numbered `Image Caption: "..." Answer: ...` lines,
answers over five words dropped), the candidates are merged and de-duplicated. A reply with no
test is counted in `warnings` (`unparseable_reply`; a query left with no test at all adds
`no_tests_for_query`) and never raises. The prompts live in `prompts/*.txt`; `template` points to
a custom one with `<QUERY>` (and `<PROGRAM>`) slots.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from vprl.rewards.unit_tests.llm_backends import SampledBackendSettings, TextBackend, build_text_backend
from vprl.rewards.unit_tests.parsing import UnitTest, merge_tests, parse_tests
from vprl.rewards.unit_tests.protocols import register_writer

log = logging.getLogger(__name__)

PROMPT_DIR = Path(__file__).parent / "prompts"
PROMPT_MODES = ("query", "query_program")
TASKS = ("vqa", "itm")
_BUILTIN = {("query", "vqa"): "tests_vqa.txt", ("query", "itm"): "tests_itm.txt"}
_PROGRAM_TEMPLATE = "tests_program.txt"
QUERY_SLOT, PROGRAM_SLOT = "<QUERY>", "<PROGRAM>"
# Base models keep writing the few-shot pattern: a new "Query:" block starts tests for a made-up query.
_NEXT_BLOCK = re.compile(r"\n\s*(?:#\s*)?Query\s*:", re.I)


@dataclass(frozen=True)
class LlmWriterConfig(SampledBackendSettings):
    STOP: ClassVar[tuple[str, ...]] = ("\nQuery:", "\n# Query:")

    prompt: str = "query"  # query | query_program
    task: str = "vqa"  # vqa | itm: which few-shot examples the query-only prompt shows
    template: str | None = None  # a prompt file with <QUERY> (and, for query_program, <PROGRAM>) slots
    num_candidates: int = 3
    temperature: float = 0.7
    max_new_tokens: int = 512

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.prompt not in PROMPT_MODES:
            raise ValueError(f"prompt must be one of {list(PROMPT_MODES)}, got {self.prompt!r}")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {list(TASKS)}, got {self.task!r}")


def load_template(config: LlmWriterConfig) -> str:
    if config.template is not None:
        path = Path(config.template)
        if not path.is_file():
            raise FileNotFoundError(f"template: no prompt file at {path}")
    else:
        name = _PROGRAM_TEMPLATE if config.prompt == "query_program" else _BUILTIN[(config.prompt, config.task)]
        path = PROMPT_DIR / name
    text = path.read_text()
    slots = [QUERY_SLOT] + ([PROGRAM_SLOT] if config.prompt == "query_program" else [])
    missing = [s for s in slots if s not in text]
    if missing:
        raise ValueError(f"prompt template {path} lacks the slot(s) {missing}")
    return text


def cut_reply(reply: str) -> str:
    """The reply up to where the model starts a new few-shot block of its own."""
    match = _NEXT_BLOCK.search(reply)
    return reply[: match.start()] if match else reply


class LlmTestWriter:
    """`write(queries, programs)` -> one list of candidate tests per query (not yet sampled to k)."""

    def __init__(self, config: LlmWriterConfig, backend: TextBackend | None = None, engine: Any = None) -> None:
        self.config = config
        self.template = load_template(config)
        self.backend = backend if backend is not None else build_text_backend(config, engine=engine)
        self.warnings: Counter = Counter()
        self.sees_program = config.prompt == "query_program"  # the reward passes programs (and keys tests on them)
        self.replies_generated = 0
        key = {k: v for k, v in asdict(config).items() if k not in ("device", "batch_size", "gpu_memory_utilization")}
        key["template"] = hashlib.sha1(self.template.encode()).hexdigest()[:12]  # editing a prompt retires the cache
        self.config_key = "llm:" + json.dumps(key, sort_keys=True)

    def prompts(self, queries: Sequence[str], programs: Sequence[str] | None = None) -> list[str]:
        if self.config.prompt == "query_program":
            if programs is None:
                raise ValueError("prompt 'query_program' writes tests from a query and a program; none were given")
            if len(programs) != len(queries):
                raise ValueError(f"{len(queries)} queries but {len(programs)} programs")
            return [self._fill(q, p) for q, p in zip(queries, programs)]
        return [self._fill(q, None) for q in queries]

    def _fill(self, query: str, program: str | None) -> str:
        text = self.template.replace(QUERY_SLOT, " ".join(query.split()))
        if program is not None:
            # The program prompt's examples start with "# Query:" and then the function: drop a
            # leading query comment the program may carry, so the query is not shown twice.
            body = re.sub(r"^\s*#\s*Query\s*:.*\n", "", program.strip("\n"), count=1)
            text = text.replace(PROGRAM_SLOT, body)
        return text

    def write(self, queries: Sequence[str], programs: Sequence[str] | None = None) -> list[list[UnitTest]]:
        if not queries:
            return []
        replies = self.backend.generate(self.prompts(queries, programs), self.config.sampling)
        if len(replies) != len(queries):
            raise RuntimeError(f"the text backend returned {len(replies)} reply lists for {len(queries)} prompts")
        self.replies_generated += sum(len(r) for r in replies)
        return [self.tests_from_replies(r, q) for r, q in zip(replies, queries)]

    def tests_from_replies(self, replies: Sequence[str], query: str = "") -> list[UnitTest]:
        """Parse each candidate reply, merge and de-duplicate (the path every backend's output takes)."""
        tests = merge_tests([parse_tests(cut_reply(r), self.warnings) for r in replies], self.warnings)
        if not tests:
            self.warnings["no_tests_for_query"] += 1
            log.debug("test writer: no parseable test in %d replies for query %r", len(replies), query)
        return tests


@register_writer("llm")
def llm_writer(engine: Any = None, text_backend: TextBackend | None = None, **settings: Any) -> LlmTestWriter:
    """Registry factory: YAML settings are `LlmWriterConfig` fields; `engine` (a vLLM engine) and
    `text_backend` are objects a caller may hand in instead of loading a model."""
    config = LlmWriterConfig.from_dict(settings, where="test writer 'llm'")
    return LlmTestWriter(config, backend=text_backend, engine=engine)
