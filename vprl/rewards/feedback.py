"""What a program's run says back to the policy: the feedback message of one repair turn.

A repair episode (docs/repair.md) shows the policy what its program did and lets it write the
program again. The message is built only from what execution and the rewards already know:

- `error`: the failure status and the exception with its program line (`describe_error`);
- `trace`: the tool calls the program made, each with its line and (short) result, and what it
  returned, as the run viewer shows them;
- `unit_tests`: the visual unit tests it failed, in ViUniT's re-prompt structure (the test image's
  content, the answer the test expects, what the program answered; docs/references.md#unit-test-feedback);
- `verdict`: in a labelled run only, that the answer it returned was judged wrong;
- `unasked`: the words its searches (`find`, `exists`, `verify_property`) look for that the question
  never uses, each with its program line: read from the program and the question alone, so a
  label-free run may show it. The tiny policy's commonest slip after RL is an object the question
  does not name (docs/repair.md); the trace shows the search, this says which word is off.

The question's reference answers are never read here: a turn's feedback is a function of the
program's own result, its tool calls and its unit tests' outcomes, so no label can reach the
policy through it (`tests/test_repair_feedback.py` plants a sentinel answer and looks for it).
Whether a turn gets feedback at all is `FeedbackConfig.wants_feedback`: the program failed, or it ran
and the run's check (a reward component: correctness with labels, unit tests without) is below
the pass threshold.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vprl.executor.results import ExecutionResult

PARTS = ("error", "trace", "unit_tests", "verdict", "unasked")
# The API methods whose first argument names what to look for in the image.
SEARCHES = ("find", "exists", "verify_property")
# Words a search phrase may hold that name nothing ("the red circle").
FILLER = frozenset({"a", "an", "the", "of"})
# A message's text at most: a trace of long tool results must not crowd the next program out of the
# context (`vprl.train.prompts.conversation.FEEDBACK_TOKENS` is the block's budget from it).
MAX_FEEDBACK_CHARS = 1000
STOP_RULES = ("ran", "passed")


@dataclass(frozen=True)
class Feedback:
    """One turn's message: which parts it holds (`PARTS`, in that order) and its text, one line
    per fact, without comment markers (the conversation format adds those)."""

    parts: tuple[str, ...]
    text: str

    def __post_init__(self) -> None:
        unknown = [p for p in self.parts if p not in PARTS]
        if unknown:
            raise ValueError(f"feedback parts {unknown} are not among {PARTS}")

    def to_json(self) -> dict[str, Any]:
        return {"parts": list(self.parts), "text": self.text}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> Feedback:
        return cls(tuple(row["parts"]), str(row["text"]))


@dataclass(frozen=True)
class FeedbackConfig:
    """When a turn gets feedback and what it shows.

    stop_when: "ran" ends the episode at the first program that runs; "passed" at the first that
    runs and scores at least `pass_threshold` on the `check` component (e.g. `correctness`, or
    `unit_tests` in a label-free run). A program the check could not score (no unit test could be
    written for its query) passes: there is no evidence to act on.
    show: the parts a message may hold. `verdict` says the answer was judged wrong and is refused
    with a check that needs no labels (`unit_tests`): a label-free run must not learn from labels.
    """

    stop_when: str = "ran"
    check: str | None = None
    pass_threshold: float = 1.0
    show: tuple[str, ...] = ("error", "trace", "unit_tests")
    max_calls: int = 6
    max_tests: int = 3

    def __post_init__(self) -> None:
        if self.stop_when not in STOP_RULES:
            raise ValueError(f"repair_stop_when {self.stop_when!r} is not one of {STOP_RULES}")
        if self.stop_when == "passed" and not self.check:
            raise ValueError("repair_stop_when 'passed' needs repair_check: the reward that decides a pass")
        unknown = [p for p in self.show if p not in PARTS]
        if unknown:
            raise ValueError(f"repair_feedback {unknown} are not among {PARTS}")
        if "verdict" in self.show and self.check == "unit_tests":
            raise ValueError("repair_feedback 'verdict' needs a labelled check, not unit_tests (a label-free run)")
        if self.max_calls < 0 or self.max_tests < 0:
            raise ValueError("the feedback's max_calls and max_tests must be >= 0")

    def passed(self, result: ExecutionResult, components: Mapping[str, float | None]) -> bool:
        if result.status != "ok":
            return False
        if self.stop_when == "ran":
            return True
        value = components.get(self.check) if self.check else None
        return value is None or value >= self.pass_threshold

    def wants_feedback(self, result: ExecutionResult, components: Mapping[str, float | None]) -> bool:
        """True when the turn has something worth acting on. Our own failure (`infra_error`) has
        not: the program was never judged."""
        return result.status != "infra_error" and not self.passed(result, components)


def turn_feedback(
    config: FeedbackConfig,
    result: ExecutionResult,
    components: Mapping[str, float | None],
    unit_tests: Sequence[Mapping[str, Any]] = (),
    program: str = "",
    question: str = "",
) -> Feedback | None:
    """The message for one turn, or None when the turn needs none (`FeedbackConfig.wants_feedback`).
    `components`: the turn's reward components; `unit_tests`: its unit tests' outcome rows
    (`TestOutcome.to_json()`), where the run has that reward; `program` and `question`: the turn's
    program and the example's query (`unasked` reads them, nothing else does)."""
    if not config.wants_feedback(result, components):
        return None
    lines: list[str] = []
    starts: dict[str, int] = {}  # each shown part's first line, so a cut message names only what it kept

    def add(part: str, more: list[str]) -> None:
        starts[part] = len(lines)
        lines.extend(more)

    if result.status != "ok" and "error" in config.show:
        add("error", [failure_line(result)])
    if "trace" in config.show:
        traced = trace_lines(result, config.max_calls)
        if traced:
            add("trace", traced)
    failed = [t for t in unit_tests if t.get("score") is None or float(t["score"]) < 1.0]
    if result.status == "ok" and failed and "unit_tests" in config.show and config.max_tests:
        add(
            "unit_tests",
            ["It failed these visual unit tests:"] + [unit_test_line(t) for t in failed[: config.max_tests]],
        )
    if result.status == "ok" and "verdict" in config.show and config.check and config.check != "unit_tests":
        add("verdict", [f"Its answer {_quoted(result.answer)} is wrong."])
    if "unasked" in config.show and question:
        off = unasked_lines(program, question)
        if off:
            add("unasked", off)
    if not lines:  # asked to show nothing that applies: still say that it did not pass
        lines.append("It did not pass its checks." if result.status == "ok" else f"It failed ({result.status}).")
    text = "\n".join(lines)
    if len(text) > MAX_FEEDBACK_CHARS:
        text = text[: MAX_FEEDBACK_CHARS - 4].rsplit("\n", 1)[0]
        kept = text.count("\n") + 1
        starts = {part: at for part, at in starts.items() if at < kept}
        text += "\n..."
    return Feedback(tuple(starts), text)


def failure_line(result: ExecutionResult) -> str:
    what = {
        "syntax_error": "It does not parse",
        "runtime_error": "It raised an exception",
        "timeout": "It ran out of time",
        "memory_limit": "It ran out of memory",
        "output_limit": "It printed too much",
        "rpc_limit": "It made too many tool calls",
        "killed": "It was killed",
        "bad_return": "It returned something that is not an answer",
    }.get(result.status, f"It failed ({result.status})")
    return f"{what}: {result.error}" if result.error else f"{what}."


def trace_lines(result: ExecutionResult, max_calls: int) -> list[str]:
    """The calls it made (the last `max_calls`, where an error most likely sits) and, when it ran,
    what it returned."""
    calls = list(result.tool_calls)
    lines = []
    if calls and max_calls:
        shown = calls[-max_calls:]
        skipped = len(calls) - len(shown)
        lines.append(f"Its tool calls ({len(calls)}" + (f", the last {len(shown)}" if skipped else "") + "):")
        for call in shown:
            where = f"line {call.line}: " if call.line else ""
            args = ", ".join(_quoted(v) for v in call.args.values())
            lines.append(f"  {where}{call.tool}({args}) -> {call.result}")
    if result.status == "ok":
        lines.append(f"It returned {_quoted(result.answer)}.")
    return lines


def _forms(word: str) -> set[str]:
    """A word and its singulars by the plain English endings ("boxes", "circles")."""
    forms = {word}
    if word.endswith("es"):
        forms.add(word[:-2])
    if word.endswith("s"):
        forms.add(word[:-1])
    return forms


def unasked_lines(program: str, question: str, limit: int = 3) -> list[str]:
    """One line per search (at most `limit`, in program order, each phrase once) whose phrase holds
    a word the question never uses, singular or plural. A program that does not parse has none to
    read (its `error` says so)."""
    try:
        tree = ast.parse(program)
    except SyntaxError:
        return []
    asked = set().union(*(_forms(w) for w in re.findall(r"[a-z]+", question.lower())))
    searches = sorted(
        (node.lineno, node.col_offset, node.args[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in SEARCHES
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )
    lines, seen = [], set()
    for line, _, phrase in searches:
        off = [w for w in re.findall(r"[a-z]+", phrase.lower()) if w not in FILLER and not _forms(w) & asked]
        if off and phrase not in seen and len(lines) < limit:
            seen.add(phrase)
            words = ", ".join(_quoted(w) for w in dict.fromkeys(off))
            lines.append(f"line {line}: it looks for {_quoted(phrase)}; the question never says {words}.")
    return lines


def unit_test_line(outcome: Mapping[str, Any]) -> str:
    got = outcome.get("answer") if outcome.get("status") == "ok" else str(outcome.get("status", "")).replace("_", " ")
    return (
        f"  image content: {_quoted(outcome.get('caption'))}; expected answer: {_quoted(outcome.get('expected'))}; "
        f"program output: {_quoted(got)}"
    )


def _quoted(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."
