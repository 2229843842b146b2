"""RefCOCO family: refs as JSON and as the official pickle, box conversion, splits, bad input."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from vprl.data.loaders import DatasetFileNotFound, DatasetFormatError, SkippedRowsWarning, load_dataset
from vprl.data.loaders.refcoco import coco_box_to_api, load_refcoco, load_refs

FIX = Path(__file__).parent / "fixtures" / "datasets" / "refcoco"
REFS_JSON = FIX / "refcoco" / "refs(unc).json"
INSTANCES = FIX / "refcoco" / "instances.json"


def test_json_refs_one_example_per_sentence():
    exs = load_dataset("refcoco", FIX, split="all")
    assert [e.id for e in exs] == ["refcoco-0", "refcoco-1", "refcoco-2", "refcoco-3"]
    first = exs[0]
    assert (first.task, first.query, first.group) == ("grounding", "the lady with the blue shirt", "person")
    assert first.image == str(FIX / "images" / "train2014" / "COCO_train2014_000000581857.jpg")
    # bbox [103.93, 299.99, 134.22, 177.95] top-left, image height 640 -> bottom-left API box
    assert first.box == pytest.approx((103.93, 640 - (299.99 + 177.95), 103.93 + 134.22, 640 - 299.99))
    assert first.meta["raw"] == "THE LADY WITH THE BLUE SHIRT" and first.meta["split"] == "val"
    assert exs[3].group == "giraffe" and exs[3].box == (200.0, 200.0, 350.0, 600.0)


def test_split_filter_and_split_names():
    assert [e.id for e in load_dataset("refcoco", FIX)] == ["refcoco-0", "refcoco-1", "refcoco-3"]
    assert [e.id for e in load_dataset("refcoco", FIX, split="testA")] == ["refcoco-2"]
    with pytest.raises(ValueError, match=r"refcoco \(unc\): unknown split 'test'; valid: \['train', 'val', 'testA'"):
        load_dataset("refcoco", FIX, split="test")


def test_box_conversion_round_trip_with_detector_convention():
    # DESIGN: a detector's (x0, y0, x1, y1) top-left box maps to left=x0, right=x1, lower=H-y1, upper=H-y0
    x, y, w, h, height = 10.0, 20.0, 30.0, 40.0, 100.0
    assert coco_box_to_api([x, y, w, h], height) == (x, height - (y + h), x + w, height - y)


def test_official_pickle_matches_json(tmp_path):
    root = tmp_path / "refer"
    shutil.copytree(FIX, root)
    refs = json.loads(REFS_JSON.read_text())
    os.remove(root / "refcoco" / "refs(unc).json")
    # protocol 2 is what the Python 2 era release used
    (root / "refcoco" / "refs(unc).p").write_bytes(pickle.dumps(refs, protocol=2))
    assert load_refs(root / "refcoco" / "refs(unc).p") == refs
    from_pickle = load_dataset("refcoco", root, split="all", images_dir="/img")
    from_json = load_refcoco(REFS_JSON, INSTANCES, "/img", splits=None)
    assert from_pickle == from_json


def test_pickle_with_code_references_is_refused(tmp_path):
    path = tmp_path / "refs(unc).p"
    path.write_bytes(pickle.dumps([{"ref_id": 0, "when": os.getcwd}]))  # any global reference
    with pytest.raises(
        DatasetFormatError, match=r"refs\(unc\)\.p: not a readable RefCOCO refs pickle \(refuses global"
    ):
        load_refs(path)


def test_refcocog_layout_and_missing_files(tmp_path):
    with pytest.raises(
        DatasetFileNotFound, match=r"refcocog/refs\(umd\)\.p: no such file; expected refcocog's refs\(umd\)\.p"
    ):
        load_dataset("refcocog", tmp_path)
    (tmp_path / "refcocog").mkdir()
    shutil.copy(REFS_JSON, tmp_path / "refcocog" / "refs(umd).json")
    with pytest.raises(DatasetFileNotFound, match=r"refcocog/instances\.json: no such file; expected the COCO-format"):
        load_dataset("refcocog", tmp_path)
    shutil.copy(INSTANCES, tmp_path / "refcocog")
    refs = json.loads(REFS_JSON.read_text())
    for ref in refs:
        ref["split"] = "test" if ref["split"] == "testA" else ref["split"]
    (tmp_path / "refcocog" / "refs(umd).json").write_text(json.dumps(refs))
    exs = load_dataset("refcocog", tmp_path, split="test")
    assert [(e.id, e.dataset) for e in exs] == [("refcocog-2", "refcocog")]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda r, i: r[1].update(ann_id=42),
            r"refs\[1\] \(ref_id 1\) refers to annotation 42, which is not in instances\.json",
        ),
        (lambda r, i: r[0]["sentences"][1].pop("sent"), r"refs\[0\] \(ref_id 0\) sentences\[1\] is missing 'sent'"),
        (
            lambda r, i: i["annotations"][2].update(bbox=[1, 2, 3]),
            r"annotation 598731 of instances\.json has bbox \[1, 2, 3\]",
        ),
        (lambda r, i: r[2].update(image_id=581857), r"refs\[2\] \(ref_id 2\) has image_id 581857 but its annotation"),
        (lambda r, i: r[2].update(category_id=99), r"has category_id 99, which is not in instances\.json"),
        (lambda r, i: r[1]["sentences"][0].update(sent_id=0), r"refs\[1\] \(ref_id 1\) repeats sent_id 0 of ref_id 0"),
    ],
)
def test_malformed_refs_name_file_and_ref(tmp_path, mutate, message):
    refs, inst = json.loads(REFS_JSON.read_text()), json.loads(INSTANCES.read_text())
    mutate(refs, inst)
    rp, ip = tmp_path / "refs(unc).json", tmp_path / "instances.json"
    rp.write_text(json.dumps(refs)), ip.write_text(json.dumps(inst))
    with pytest.raises(DatasetFormatError, match=message) as err:
        load_refcoco(rp, ip, tmp_path)
    assert str(rp) in str(err.value)
    with pytest.warns(SkippedRowsWarning, match="skipped 1 bad row"):
        exs = load_refcoco(rp, ip, tmp_path, skip_bad_rows=True)
    assert 1 <= len(exs) < 4


def test_instances_top_level_errors_are_not_skippable(tmp_path):
    inst = json.loads(INSTANCES.read_text())
    del inst["categories"]
    ip = tmp_path / "instances.json"
    ip.write_text(json.dumps(inst))
    with pytest.raises(DatasetFormatError, match=r"instances\.json: the top-level object is missing 'categories'"):
        load_refcoco(REFS_JSON, ip, tmp_path, skip_bad_rows=True)


def test_images_in_the_refer_layout_are_found(tmp_path):
    """refer.py reads the COCO sets' images from images/mscoco/images/train2014: a root laid out that
    way loads with its images found, and ours (images/train2014) wins where both exist."""
    root = tmp_path / "refer"
    shutil.copytree(FIX, root)
    refer_images = root / "images" / "mscoco" / "images" / "train2014"
    refer_images.mkdir(parents=True)
    for e in load_dataset("refcoco", root, split="all", images_dir=refer_images):
        Path(e.image).write_bytes(b"jpeg")
    exs = load_dataset("refcoco", root, split="all", check_images=True)
    assert exs[0].image == str(refer_images / "COCO_train2014_000000581857.jpg")
    ours = root / "images" / "train2014"
    ours.mkdir()
    assert Path(load_dataset("refcoco", root, split="all")[0].image).parent == ours
