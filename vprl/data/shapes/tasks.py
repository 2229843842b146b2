"""Reading a generated shapes world back as tasks, through the real datasets' loaders.

Task names and what they hold:

=========== ================================================================================
train       GQA-format questions of the training families, on training images
val         the training families on held-out images (in-distribution evaluation)
heldout     the held-out question families on the same held-out images (cross-family)
winoground  image-text matching, Winoground format (cross-task)
sugarcrepe  image-text matching, SugarCREPE format (cross-task)
refcoco     referring expressions, RefCOCO format, val refs (cross-task grounding)
=========== ================================================================================
"""

from __future__ import annotations

from pathlib import Path

from vprl.data.loaders import load_dataset
from vprl.data.records import Example

TASKS: dict[str, tuple[str, str | None, str]] = {
    # name: (loader, split, folder under the dataset root)
    "train": ("gqa", "train", "gqa"),
    "val": ("gqa", "val", "gqa"),
    "heldout": ("gqa", "testdev", "gqa"),
    "winoground": ("winoground", None, "winoground"),
    "sugarcrepe": ("sugarcrepe", None, "sugarcrepe"),
    "refcoco": ("refcoco", "val", "refcoco"),
}
SCENE_GRAPH_FILES = (
    "gqa/train_sceneGraphs.json",
    "gqa/val_sceneGraphs.json",
    "winoground/sceneGraphs.json",
    "sugarcrepe/sceneGraphs.json",
    "refcoco/sceneGraphs.json",
)


def load_shapes_task(root: str | Path, name: str) -> list[Example]:
    if name not in TASKS:
        raise ValueError(f"unknown shapes-world task {name!r}; valid: {sorted(TASKS)}")
    loader, split, folder = TASKS[name]
    opts = {"image_pattern": "{image_id}.png"} if loader == "gqa" else {}
    return load_dataset(loader, Path(root) / folder, split, **opts)


def load_shapes_tasks(root: str | Path, names: list[str] | None = None) -> dict[str, list[Example]]:
    return {name: load_shapes_task(root, name) for name in (names or list(TASKS))}


def scene_graph_files(root: str | Path) -> list[Path]:
    """Every scene-graph file of a generated world (what the `oracle` backend needs)."""
    paths = [Path(root) / rel for rel in SCENE_GRAPH_FILES]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"shapes world at {root} lacks {missing}; regenerate it with python -m vprl.data.shapes"
        )
    return paths
