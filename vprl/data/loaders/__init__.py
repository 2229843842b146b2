"""Official-format dataset loaders and the `load_dataset` registry.

`load_dataset(name, root, split=None, **opts)` reads a dataset from its official download layout
under `root` and returns `list[Example]`. `split=None` means the dataset's default split. `opts`
are the keyword options of the dataset's `load_*_root` function (file/folder overrides,
`skip_bad_rows`, `check_images`, ...); an unknown one is an error listing the valid ones.

Layouts (every path can be overridden through opts):

=========== ================================================ ==================== ==============
name        files under root                                 images               default split
=========== ================================================ ==================== ==============
gqa         <split>_balanced_questions.json (or questions/)  images/<id>.jpg      val
vqav2       v2_OpenEnded_mscoco_<split>2014_questions.json,  <split>2014/         val
            v2_mscoco_<split>2014_annotations.json
okvqa       OpenEnded_mscoco_<split>2014_questions.json,     <split>2014/         val
            mscoco_<split>2014_annotations.json
winoground  examples.jsonl (or data/examples.jsonl)          images/ beside it    test
sugarcrepe  data/<category>.json (or <category>.json)        val2017/             test
refcoco     refcoco/refs(unc).p, refcoco/instances.json      images/train2014/    val
refcoco+    refcoco+/refs(unc).p, refcoco+/instances.json    images/train2014/    val
refcocog    refcocog/refs(umd).p, refcocog/instances.json    images/train2014/    val
nextqa      <split>.csv (or nextqa/, dataset/nextqa/),       NExTVideo/<dir>/     val
            map_vid_vidorID.json beside it                   <id>.mp4 (or videos/)
=========== ================================================ ==================== ==============
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from vprl.data.loaders._common import (
    DatasetFileNotFound,
    DatasetFormatError,
    SkippedRowsWarning,
    check_image_files,
)
from vprl.data.loaders.gqa import load_gqa_questions, load_gqa_root, load_scene_graphs
from vprl.data.loaders.nextqa import load_nextqa, load_nextqa_root
from vprl.data.loaders.refcoco import load_refcoco, load_refcoco_root
from vprl.data.loaders.sugarcrepe import load_sugarcrepe, load_sugarcrepe_root
from vprl.data.loaders.vqav2 import load_vqa, load_vqa_root
from vprl.data.loaders.winoground import load_winoground, load_winoground_root
from vprl.data.records import Example

# name -> (root loader with the dataset fixed, default split)
_REGISTRY: dict[str, tuple[Callable[..., list[Example]], str]] = {
    "gqa": (load_gqa_root, "val"),
    "vqav2": (partial(load_vqa_root, dataset="vqav2"), "val"),
    "okvqa": (partial(load_vqa_root, dataset="okvqa"), "val"),
    "winoground": (load_winoground_root, "test"),
    "sugarcrepe": (load_sugarcrepe_root, "test"),
    "refcoco": (partial(load_refcoco_root, dataset="refcoco"), "val"),
    "refcoco+": (partial(load_refcoco_root, dataset="refcoco+"), "val"),
    "refcocog": (partial(load_refcoco_root, dataset="refcocog"), "val"),
    "nextqa": (load_nextqa_root, "val"),
}
DATASETS = tuple(_REGISTRY)


def dataset_options(name: str) -> list[str]:
    """The keyword options `load_dataset(name, ...)` accepts beyond root and split."""
    fn, _ = _lookup(name)
    fixed = fn.keywords if isinstance(fn, partial) else {}
    params = inspect.signature(fn.func if isinstance(fn, partial) else fn).parameters
    return [p for p in params if p not in ("root", "split", *fixed)]


def _lookup(name: str) -> tuple[Callable[..., list[Example]], str]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")
    return _REGISTRY[name]


def load_dataset(name: str, root: str | Path, split: str | None = None, **opts: Any) -> list[Example]:
    """Load dataset `name` from its official layout under `root` (see the module docstring)."""
    fn, default_split = _lookup(name)
    valid = dataset_options(name)
    unknown = sorted(set(opts) - set(valid))
    if unknown:
        raise ValueError(f"{name}: unknown option(s) {unknown}; valid options: {valid}")
    return fn(root, split or default_split, **opts)


__all__ = [
    "DATASETS",
    "DatasetFileNotFound",
    "DatasetFormatError",
    "SkippedRowsWarning",
    "check_image_files",
    "dataset_options",
    "load_dataset",
    "load_gqa_questions",
    "load_nextqa",
    "load_refcoco",
    "load_scene_graphs",
    "load_sugarcrepe",
    "load_vqa",
    "load_winoground",
]
