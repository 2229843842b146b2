"""The shapes world's dataset: real-format files read by the real loaders, gold programs that the
oracle tools answer perfectly, family splits, determinism, and clear errors on corrupt files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vprl.data.loaders import DatasetFormatError, load_dataset, load_scene_graphs
from vprl.data.shapes import FAMILIES, HELDOUT_FAMILIES, TRAIN_FAMILIES, BuildConfig, build_dataset, load_gold_programs
from vprl.data.shapes.__main__ import main as cli_main
from vprl.data.shapes.matching import SUGARCREPE_CATEGORIES
from vprl.executor.api import SourceImage
from vprl.executor.program import run_in_process
from vprl.executor.tools.images import ImageStore
from vprl.executor.tools.local import LocalToolClient
from vprl.executor.tools.oracle import OracleBackend
from vprl.executor.tools.shapes import ShapesBackend

GQA = {"image_pattern": "{image_id}.png"}
SCENE_FILES = [
    "gqa/train_sceneGraphs.json",
    "gqa/val_sceneGraphs.json",
    "winoground/sceneGraphs.json",
    "sugarcrepe/sceneGraphs.json",
    "refcoco/sceneGraphs.json",
]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shapes")
    build_dataset(BuildConfig(str(out), train=40, val=400, seed=5, winoground=10, sugarcrepe=4, refcoco=30, workers=1))
    return out


def _examples(root: Path):
    return {
        "train": load_dataset("gqa", root / "gqa", "train", check_images=True, **GQA),
        "val": load_dataset("gqa", root / "gqa", "val", check_images=True, **GQA),
        "testdev": load_dataset("gqa", root / "gqa", "testdev", check_images=True, **GQA),
        "winoground": load_dataset("winoground", root / "winoground", check_images=True),
        "sugarcrepe": load_dataset("sugarcrepe", root / "sugarcrepe", check_images=True),
        "refcoco": load_dataset("refcoco", root / "refcoco", "all", check_images=True),
    }


def test_real_loaders_read_every_file(root):
    ex = _examples(root)
    assert [len(ex[s]) for s in ("train", "val", "testdev")] == [40, 400, 400]
    assert len(ex["winoground"]) == 10 * 4
    assert len(ex["sugarcrepe"]) == 4 * 2 * len(SUGARCREPE_CATEGORIES)
    assert {e.group for e in ex["sugarcrepe"]} == set(SUGARCREPE_CATEGORIES)
    assert ex["refcoco"] and all(e.task == "grounding" and e.box is not None for e in ex["refcoco"])
    assert {e.meta["split"] for e in ex["refcoco"]} == {"train", "val"}
    # Winoground: each caption is true of its own image only.
    assert sorted({(e.meta["image_index"] == e.meta["caption_index"], e.answers[0]) for e in ex["winoground"]}) == [
        (False, "no"),
        (True, "yes"),
    ]
    # The family is the Example's group, and every question's image has a scene graph.
    scenes = {}
    for name in SCENE_FILES:
        scenes.update(load_scene_graphs(root / name))
    for split in ("train", "val", "testdev"):
        assert all(e.group in FAMILIES for e in ex[split])
        assert all(e.meta["imageId"] in scenes for e in ex[split])
    # Scene graphs follow GQA: name = shape, attributes = [colour, size], top-left boxes.
    obj = next(iter(next(iter(scenes.values())).objects.values()))
    assert obj.name in ("circle", "square", "triangle", "star", "hexagon")
    assert obj.attributes[1] in ("small", "large") and obj.w > 0 and obj.h > 0


def test_family_splits(root):
    ex = _examples(root)
    assert {e.group for e in ex["train"]} <= set(TRAIN_FAMILIES)
    assert {e.group for e in ex["val"]} == set(TRAIN_FAMILIES)
    assert {e.group for e in ex["testdev"]} == set(HELDOUT_FAMILIES)
    assert len(FAMILIES) >= 15 and not set(TRAIN_FAMILIES) & set(HELDOUT_FAMILIES)
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["vqa_families"]["heldout"] == list(HELDOUT_FAMILIES)


def _run_gold(root: Path, backend) -> dict[str, list[int]]:
    gold = load_gold_programs(root)
    client = LocalToolClient(backend)
    ex = _examples(root)
    per_group: dict[str, list[int]] = {}
    for e in [x for split in ("val", "testdev", "winoground", "sugarcrepe", "refcoco") for x in ex[split]]:
        info = backend.images.add_file(e.image)
        client.trace.clear()  # the call cap counts the trace
        outcome, _, _ = run_in_process(
            gold[e.task][e.query], {"image": SourceImage(info.ref, info.width, info.height)}, client
        )
        if e.task == "grounding":
            right = outcome.status == "ok" and outcome.answer["box"] == [int(v) for v in e.box]
        else:
            right = outcome.status == "ok" and str(outcome.answer).lower() == e.answers[0]
        counts = per_group.setdefault(f"{e.dataset}/{e.group}", [0, 0])
        counts[0] += right
        counts[1] += 1
    return per_group


def test_gold_programs_are_all_correct_with_oracle_tools(root):
    scenes = {}
    for name in SCENE_FILES:
        scenes.update(load_scene_graphs(root / name))
    per_group = _run_gold(root, OracleBackend(ImageStore(), scenes=scenes))
    assert {g.split("/")[1] for g in per_group if g.startswith("gqa/")} == set(FAMILIES)
    wrong = {g: c for g, c in per_group.items() if c[0] != c[1]}
    assert not wrong, f"gold programs wrong with the oracle tools: {wrong}"


def test_gold_programs_mostly_correct_with_shapes_tools(root):
    per_group = _run_gold(root, ShapesBackend(ImageStore()))
    right = sum(c[0] for c in per_group.values())
    total = sum(c[1] for c in per_group.values())
    # Pixel-only tools are imperfect, but on this clean world far better than chance.
    assert right / total > 0.9, per_group


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_cli_is_deterministic(tmp_path):
    """Same seed, same bytes: across processes, string-hash seeds and worker counts."""
    args = ["--train", "80", "--val", "10", "--winoground", "2", "--sugarcrepe", "1", "--refcoco", "3"]
    cli_main(["--out", str(tmp_path / "a"), "--seed", "3", "--workers", "1", *args])
    cli_main(["--out", str(tmp_path / "c"), "--seed", "4", "--workers", "1", *args])
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    cmd = [
        sys.executable,
        "-m",
        "vprl.data.shapes",
        "--out",
        str(tmp_path / "b"),
        "--seed",
        "3",
        "--workers",
        "2",
        *args,
    ]
    subprocess.run(cmd, check=True, env=env, cwd=Path(__file__).parents[1], capture_output=True)
    a, b, c = (_digest(tmp_path / n) for n in "abc")
    assert a == b and len(a) > 20
    assert a != c


def test_corrupt_scene_graph_names_file_and_key(root, tmp_path):
    data = json.loads((root / "gqa" / "val_sceneGraphs.json").read_text())
    image_id = next(iter(data))
    obj_id = next(iter(data[image_id]["objects"]))
    del data[image_id]["objects"][obj_id]["w"]
    bad = tmp_path / "val_sceneGraphs.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(DatasetFormatError, match=rf"val_sceneGraphs.json.*'{image_id}'.*'{obj_id}'.*'w'"):
        load_scene_graphs(bad)
    with pytest.raises(DatasetFormatError, match="val_sceneGraphs.json"):
        OracleBackend(ImageStore(), scene_graphs=str(bad))
