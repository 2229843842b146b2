"""The shapes world: procedurally rendered scenes of coloured shapes with exact ground truth,
written in the real datasets' file formats (GQA, Winoground, SugarCREPE, RefCOCO) with a gold
program per question. `python -m vprl.data.shapes --out DIR` writes a dataset."""

from __future__ import annotations

import json
from pathlib import Path

from vprl.data.shapes.build import BuildConfig, build_dataset
from vprl.data.shapes.questions import FAMILIES, HELDOUT_FAMILIES, TRAIN_FAMILIES


def load_gold_programs(root: str | Path) -> dict[str, dict[str, str]]:
    """`{task: {Example.query: gold program}}` of a generated dataset."""
    path = Path(root) / "gold_programs.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no such file; generate the dataset with `python -m vprl.data.shapes --out {root}`"
        )
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


__all__ = ["FAMILIES", "HELDOUT_FAMILIES", "TRAIN_FAMILIES", "BuildConfig", "build_dataset", "load_gold_programs"]
