"""In-context examples (ICEs): query -> program pairs read from a JSONL file.

One row per line: `{"query": ..., "program": ..., ...}`. Extra keys (a score, the source example
id, ...) are kept in `extra` so that ACE files written by the miner round-trip unchanged. The same
format serves hand-written example files and automatically mined ACE files.
"""

from __future__ import annotations

import ast
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class IncontextExample:
    query: str
    program: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"query": self.query, "program": self.program, **self.extra}

    @classmethod
    def from_json(cls, row: Any, where: str) -> IncontextExample:
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object with 'query' and 'program', got {type(row).__name__}")
        missing = [key for key in ("query", "program") if key not in row]
        if missing:
            raise ValueError(f"{where}: missing key(s) {missing}; an example needs 'query' and 'program'")
        for key in ("query", "program"):
            if not isinstance(row[key], str) or not row[key].strip():
                raise ValueError(f"{where}: {key!r} must be a non-empty string, got {row[key]!r:.60}")
        program = row["program"].replace("\r\n", "\n").strip("\n") + "\n"
        try:
            ast.parse(program)
        except SyntaxError as exc:
            # A broken example teaches the model broken code, so it is refused, not skipped.
            raise ValueError(f"{where}: the program does not parse ({exc.msg}, program line {exc.lineno})") from None
        extra = {k: v for k, v in row.items() if k not in ("query", "program")}
        return cls(query=row["query"].strip(), program=program, extra=extra)


@dataclass(frozen=True)
class ExampleSet:
    """The examples a prompt uses, with how many the file held (truncation is recorded, not hidden)."""

    examples: tuple[IncontextExample, ...]
    path: str | None = None
    available: int = 0

    @property
    def truncated(self) -> bool:
        return len(self.examples) < self.available


def read_examples(path: str | Path) -> list[IncontextExample]:
    """Every example in a JSONL file, in file order. Blank lines are allowed; anything else that is
    not a valid example is an error naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"in-context example file {str(path)!r} does not exist")
    examples = []
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            examples.append(IncontextExample.from_json(row, where))
    return examples


def load_examples(path: str | Path | None, max_examples: int | None = None) -> ExampleSet:
    """The first `max_examples` examples of the file (all when None); no file gives no examples."""
    if path is None:
        return ExampleSet(examples=(), path=None, available=0)
    if max_examples is not None and max_examples < 0:
        raise ValueError(f"max_ices must be >= 0 or None, got {max_examples}")
    examples = read_examples(path)
    kept = examples if max_examples is None else examples[:max_examples]
    if len(kept) < len(examples):
        logger.info("using the first %d of %d in-context examples in %s (max_ices)", len(kept), len(examples), path)
    return ExampleSet(examples=tuple(kept), path=str(path), available=len(examples))


def write_examples(path: str | Path, examples: list[IncontextExample]) -> None:
    """Write examples as JSONL (the format `read_examples` reads)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for example in examples:
            handle.write(json.dumps(example.to_json(), ensure_ascii=False) + "\n")


def render_examples(examples: tuple[IncontextExample, ...] | list[IncontextExample], query_prefix: str = "") -> str:
    """Each example as `# <prefix><query>` followed by its program, separated by a blank line."""
    blocks = [comment(f"{query_prefix}{ex.query}") + "\n" + ex.program for ex in examples]
    return "\n".join(blocks)


def comment(text: str) -> str:
    """`text` as Python comment lines (`# ...`), one per line of text."""
    return "\n".join(f"# {line}".rstrip() for line in text.strip("\n").split("\n"))
