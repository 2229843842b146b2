"""The `UnitTest` record and parsing of test-writer replies.

A reply lists tests as numbered lines `N. Image Caption: "<description>" Answer: <answer>`;
models wrap lines, drop quotes and run two tests together, so parsing matches on the markers, not
on lines. Unparseable replies yield no tests and a counted warning, never an exception.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

MAX_ANSWER_WORDS = 5  # ViUniT drops tests whose answer is longer: out of distribution for the task

_TEST = re.compile(
    r"Image\s+Caption\s*:\s*(?P<caption>\"[^\"]+\"|.+?)\s*Answer\s*:\s*(?P<answer>.+?)\s*(?=(?:\d+\s*\.\s*)?Image\s+Caption\s*:|\n\s*\n|$)",
    flags=re.S | re.I,
)


@dataclass(frozen=True)
class UnitTest:
    caption: str  # the description the image generator renders
    answer: str  # what a correct program answers on that image

    @property
    def key(self) -> str:
        """Content key: the cache of rendered images is keyed on it."""
        return hashlib.sha1(f"{self.caption}\x00{self.answer}".encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> UnitTest:
        return cls(str(row["caption"]), str(row["answer"]))


def _clean_answer(text: str) -> str:
    text = re.split(r"\n|\s\d+\s*\.\s*$", text.strip())[0]
    return text.strip().strip("\"'").rstrip(".").strip().lower()


def parse_tests(reply: str, warnings: Counter | None = None) -> list[UnitTest]:
    """All well-formed tests in a reply, de-duplicated, answers of at most five words kept.

    `warnings` (if given) counts why tests were dropped: `unparseable_reply`, `long_answer`,
    `duplicate`, `empty`.
    """
    warnings = warnings if warnings is not None else Counter()
    found = list(_TEST.finditer(reply))
    if not found:
        warnings["unparseable_reply"] += 1
        return []
    tests: list[UnitTest] = []
    seen: set[tuple[str, str]] = set()
    for m in found:
        caption = " ".join(m.group("caption").strip().strip('"').split())
        answer = _clean_answer(m.group("answer"))
        if not caption or not answer:
            warnings["empty"] += 1
            continue
        if len(answer.split()) > MAX_ANSWER_WORDS:
            warnings["long_answer"] += 1
            continue
        ident = (caption.lower(), answer)
        if ident in seen:
            warnings["duplicate"] += 1
            continue
        seen.add(ident)
        tests.append(UnitTest(caption, answer))
    return tests


def merge_tests(batches: list[list[UnitTest]], warnings: Counter | None = None) -> list[UnitTest]:
    """Union of several replies' tests (ViUniT samples 3 sequences), first occurrence kept."""
    warnings = warnings if warnings is not None else Counter()
    out, seen = [], set()
    for batch in batches:
        for test in batch:
            ident = (test.caption.lower(), test.answer)
            if ident in seen:
                warnings["duplicate"] += 1
                continue
            seen.add(ident)
            out.append(test)
    return out
