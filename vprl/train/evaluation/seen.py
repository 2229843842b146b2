"""Seen and unseen questions: a dataset's examples split by whether their query was a training query.

A policy whose prompt holds only the query can score on an evaluation question by recalling the
program it was trained on for the same words; a gain there is memory, not generalization. With
`seen_from` (the training examples) and `seen_split` (datasets to split), each named dataset is
evaluated as two: `<name>-unseen` (queries never trained on: the headline) and `<name>-seen`.
The split is a partition, so it costs no extra generation.
"""

from __future__ import annotations

import re
from pathlib import Path

from vprl.data.records import Example, read_examples

SUFFIXES = ("-unseen", "-seen")


def normalize_query(query: str) -> str:
    """The words of a query, case, spacing and final punctuation ignored."""
    return re.sub(r"\s+", " ", query.strip().lower()).rstrip(" ?.!")


def seen_queries(source: str) -> set[str]:
    """The training queries of `source`: a shapes world folder (its `train` task) or a JSONL file of
    `Example` rows."""
    path = Path(source)
    if path.is_dir():
        if not (path / "manifest.json").is_file():
            raise ValueError(f"seen_from: {source} is a folder but not a shapes world (no manifest.json)")
        from vprl.data.shapes.tasks import load_shapes_task

        examples = load_shapes_task(path, "train")
    elif path.is_file():
        examples = read_examples(path)
    else:
        raise ValueError(f"seen_from: {source} does not exist (a shapes world folder or a JSONL of examples)")
    return {normalize_query(e.query) for e in examples}


def split_seen(data: dict[str, list[Example]], names: list[str], seen: set[str]) -> dict[str, list[Example]]:
    """`data` with each dataset of `names` replaced by its unseen and seen parts (in that order, each
    only when it holds examples)."""
    out: dict[str, list[Example]] = {}
    for name, examples in data.items():
        if name not in names:
            out[name] = examples
            continue
        parts: dict[str, list[Example]] = {f"{name}-unseen": [], f"{name}-seen": []}
        for e in examples:
            parts[f"{name}-seen" if normalize_query(e.query) in seen else f"{name}-unseen"].append(e)
        out.update({part: rows for part, rows in parts.items() if rows})
    return out


def check_seen_settings(seen_from: str, seen_split: list[str], datasets: list[str]) -> None:
    if not seen_split:
        return
    if not seen_from:
        raise ValueError("seen_split: needs seen_from, the training examples (a shapes world or a JSONL)")
    unknown = [name for name in seen_split if name not in datasets]
    if unknown:
        raise ValueError(f"seen_split: {unknown} are not among the datasets {datasets}")
    if not Path(seen_from).exists():
        raise ValueError(f"seen_from: {seen_from} does not exist (a shapes world folder or a JSONL of examples)")
