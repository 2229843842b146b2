"""The `Example` record: one question about one image, as every loader emits it.

It is the only thing the data layer hands upwards, and it crosses process boundaries as plain
JSON (`to_json` / `from_json`), never pickle.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vprl.data.typed import check_row

TASKS = ("vqa", "itm", "grounding", "video_qa")


@dataclass(frozen=True)
class Example:
    """One evaluation or training item.

    `answers` holds every reference answer (the ten annotator answers for VQAv2/OK-VQA, one for
    GQA, "yes"/"no" for image-text matching). `box` is the grounding target in the API's
    convention: `(left, lower, right, upper)` in pixels, origin at the bottom-left.
    """

    id: str
    dataset: str
    task: str
    query: str
    image: str
    answers: tuple[str, ...] = ()
    box: tuple[float, float, float, float] | None = None
    group: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"Example {self.id!r}: task {self.task!r} is not one of {TASKS}")
        # Lists from JSON become tuples so that records stay hashable-ish and immutable.
        object.__setattr__(self, "answers", tuple(str(a) for a in self.answers))
        if self.box is not None:
            if len(self.box) != 4:
                raise ValueError(f"Example {self.id!r}: box must have 4 numbers, got {self.box!r}")
            object.__setattr__(self, "box", tuple(float(v) for v in self.box))

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["answers"] = list(self.answers)
        out["box"] = list(self.box) if self.box is not None else None
        return out

    @classmethod
    def from_json(cls, row: dict[str, Any], where: str = "") -> Example:
        check_row(cls, row, where or "Example", required=("id", "dataset", "task", "query", "image"))
        try:
            return cls(**row)
        except ValueError as exc:
            raise ValueError(f"{where or 'Example'}: {exc}") from None


def write_jsonl(path: str | Path, rows: Iterable[Any]) -> int:
    """Write records (anything with `to_json`, or plain dicts) as JSON lines; returns the count."""
    n = 0
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            obj = row.to_json() if hasattr(row, "to_json") else row
            fh.write(json.dumps(obj, ensure_ascii=False, sort_keys=True) + "\n")
            n += 1
    return n


def read_jsonl(
    path: str | Path, on_error: Callable[[int, str], None] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line_number, row)`. A malformed line fails with the file and line number, or, with
    `on_error`, is reported as `on_error(line_number, reason)` and skipped."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                reason = None if isinstance(row, dict) else f"expected a JSON object, got {type(row).__name__}"
            except json.JSONDecodeError as exc:
                reason = f"not valid JSON ({exc.msg})"
            if reason is None:
                yield lineno, row
            elif on_error is None:
                raise ValueError(f"{path}:{lineno}: {reason}")
            else:
                on_error(lineno, reason)


def read_examples(path: str | Path) -> list[Example]:
    """Read a JSONL file of `Example` rows, naming the file and line of any bad row."""
    return [Example.from_json(row, where=f"{path}:{lineno}") for lineno, row in read_jsonl(path)]
