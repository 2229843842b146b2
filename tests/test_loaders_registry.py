"""The `load_dataset` registry: every name reads its fixture; unknown names and options are errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vprl.data.loaders import DATASETS, dataset_options, load_dataset
from vprl.data.records import Example, read_examples, write_jsonl

FIX = Path(__file__).parent / "fixtures" / "datasets"


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    # refcoco+ and refcocog share the refer layout; give them the RefCOCO fixture under their folders.
    refer = tmp_path_factory.mktemp("refer")
    for folder, stem in (("refcoco", "unc"), ("refcoco+", "unc"), ("refcocog", "umd")):
        (refer / folder).mkdir()
        shutil.copy(FIX / "refcoco" / "refcoco" / "instances.json", refer / folder)
        shutil.copy(FIX / "refcoco" / "refcoco" / "refs(unc).json", refer / folder / f"refs({stem}).json")
    by_name = {name: FIX / name for name in ("gqa", "vqav2", "okvqa", "winoground", "sugarcrepe", "nextqa")}
    return by_name | dict.fromkeys(("refcoco", "refcoco+", "refcocog"), refer)


EXPECTED = {
    "gqa": (4, "vqa"),
    "vqav2": (3, "vqa"),
    "okvqa": (2, "vqa"),
    "winoground": (12, "itm"),
    "sugarcrepe": (16, "itm"),
    "refcoco": (3, "grounding"),
    "refcoco+": (3, "grounding"),
    "refcocog": (3, "grounding"),
    "nextqa": (5, "video_qa"),
}


@pytest.mark.parametrize("name", DATASETS)
def test_every_registered_name_loads_its_fixture(name, roots, tmp_path):
    exs = load_dataset(name, roots[name])
    n, task = EXPECTED[name]
    assert len(exs) == n
    assert {e.task for e in exs} == {task} and {e.dataset for e in exs} == {name}
    assert len({e.id for e in exs}) == n
    # what the loaders emit must survive the JSONL hand-off to other processes
    write_jsonl(tmp_path / "x.jsonl", exs)
    assert read_examples(tmp_path / "x.jsonl") == exs


def test_registry_covers_the_stated_names():
    assert set(DATASETS) == {
        "gqa", "vqav2", "okvqa", "winoground", "sugarcrepe", "refcoco", "refcoco+", "refcocog", "nextqa"
    }  # fmt: skip


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown dataset 'coco'; valid names: gqa, vqav2, okvqa, winoground"):
        load_dataset("coco", FIX)


def test_unknown_option_lists_valid_options():
    with pytest.raises(
        ValueError, match=r"vqav2: unknown option\(s\) \['image_dir'\]; valid options: \[.*'images_dir'"
    ):
        load_dataset("vqav2", FIX / "vqav2", image_dir="x")
    assert "dataset" not in dataset_options("okvqa")  # fixed by the registry entry
    assert {"skip_bad_rows", "check_images"} <= set(dataset_options("refcocog"))


def test_options_reach_the_loader(roots):
    [ex] = load_dataset("refcoco", roots["refcoco"], split="testA", images_dir="/coco/train2014")
    assert ex.image == str(Path("/coco/train2014") / "COCO_train2014_000000581857.jpg")
    exs = load_dataset("gqa", FIX / "gqa", image_pattern="{image_id}.png", dataset="shapes")
    assert exs[0].image.endswith("2354786.png") and isinstance(exs[0], Example) and exs[0].dataset == "shapes"
