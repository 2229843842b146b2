"""The image-text matching and grounding programs the tiny policy can learn besides its VQA ones
(`BootstrapConfig.tasks`): which examples of the world, and their families."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vprl.data.loaders import load_dataset
from vprl.data.records import Example
from vprl.data.shapes.tasks import load_shapes_tasks


def other_tasks(root: Path, tasks: Sequence[str]) -> list[Example]:
    """The world's image-text matching and grounding examples the policy learns, per `tasks`."""
    out: list[Example] = []
    if "itm" in tasks:
        out += [ex for exs in load_shapes_tasks(root, ["winoground", "sugarcrepe"]).values() for ex in exs]
    if "grounding" in tasks:
        out += [ex for split in ("train", "val") for ex in load_dataset("refcoco", root / "refcoco", split)]
    return out


def task_family(example: Example, program: str) -> str:
    """A non-VQA family: the caption's Winoground tag or SugarCREPE category; the referral's kind,
    read off its gold program (`vprl.data.shapes.grounding`)."""
    if example.task == "grounding":
        kind = "relation" if "anchor" in program else "position" if "key=lambda" in program else "attribute"
        return f"grounding:{kind}"
    return f"{example.task}:{example.group}"
