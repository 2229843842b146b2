"""Image-text matching sets: Winoground (with its text/image/group scores) and SugarCREPE."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from vprl.data.loaders import DatasetFileNotFound, DatasetFormatError, SkippedRowsWarning, load_dataset
from vprl.data.loaders.sugarcrepe import CATEGORIES, load_sugarcrepe, load_sugarcrepe_file
from vprl.data.loaders.winoground import load_winoground, load_winoground_root
from vprl.data.loaders.winoground_scores import example_scores, winoground_scores

FIX = Path(__file__).parent / "fixtures" / "datasets"
WINO = FIX / "winoground" / "data" / "examples.jsonl"


# --- Winoground ------------------------------------------------------------------------------------


def test_winoground_fixture_gives_four_pairings_per_example():
    exs = load_winoground_root(FIX / "winoground")
    assert len(exs) == 3 * 4
    first = exs[:4]
    assert [e.id for e in first] == [
        "winoground-0-i0-c0",
        "winoground-0-i0-c1",
        "winoground-0-i1-c0",
        "winoground-0-i1-c1",
    ]
    assert [e.answers for e in first] == [("yes",), ("no",), ("no",), ("yes",)]
    assert first[1].query == 'Verify image matches text="a young person kisses an old person"'
    assert first[1].image == str(WINO.parent / "images" / "ex_0_img_0.png")
    assert first[2].image.endswith("ex_0_img_1.png")
    assert all(e.task == "itm" and e.group == "Noun" for e in first)
    assert first[3].meta == {
        "winoground_id": "0", "image_index": 1, "caption_index": 1, "caption": "a young person kisses an old person",
        "other_caption": "an old person kisses a young person", "image_name": "ex_0_img_1", "tag": "Noun", "secondary_tag": "", "num_main_preds": 1, "collapsed_tag": "Object",
    }  # fmt: skip
    assert exs[4].group == "Adjective-Size"


def test_winoground_bad_lines_name_file_and_line(tmp_path):
    lines = WINO.read_text().splitlines()
    row = json.loads(lines[1])
    del row["caption_1"]
    path = tmp_path / "examples.jsonl"
    path.write_text("\n".join([lines[0], json.dumps(row), "{not json", lines[2]]) + "\n")
    with pytest.raises(DatasetFormatError, match=r"examples\.jsonl: line 2 is missing 'caption_1'"):
        load_winoground(path, tmp_path)
    with pytest.warns(SkippedRowsWarning) as rec:
        exs = load_winoground(path, tmp_path, skip_bad_rows=True)
    assert len(exs) == 8
    [w] = [r.message for r in rec]
    assert w.count == 2 and w.reasons[1].startswith("line 3: not valid JSON")


def test_winoground_duplicate_id_is_an_error(tmp_path):
    path = tmp_path / "examples.jsonl"
    line = WINO.read_text().splitlines()[0]
    path.write_text(line + "\n" + line + "\n")
    with pytest.raises(DatasetFormatError, match="line 2 repeats id 0 \\(first on line 1\\)"):
        load_winoground(path, tmp_path)


def test_winoground_missing_file_and_split(tmp_path):
    with pytest.raises(
        DatasetFileNotFound, match=r"expected Winoground .*data/test-\*\.parquet .*examples\.jsonl"
    ) as err:
        load_winoground_root(tmp_path)
    # lists every place it looked, for both releases
    assert str(tmp_path / "data" / "examples.jsonl") in str(err.value)
    assert str(tmp_path / "data" / "test-*.parquet") in str(err.value)
    with pytest.raises(ValueError, match="only the 'test' split"):
        load_winoground_root(FIX / "winoground", "train")


def test_winoground_check_images(tmp_path):
    shutil.copytree(FIX / "winoground", tmp_path / "wg")
    images = tmp_path / "wg" / "data" / "images"
    images.mkdir()
    for k in range(3):
        for i in (0, 1):
            Image.new("RGB", (4, 4), (k * 40, i * 90, 0)).save(images / f"ex_{k}_img_{i}.png")
    assert len(load_dataset("winoground", tmp_path / "wg", check_images=True)) == 12
    (images / "ex_2_img_1.png").unlink()
    with pytest.raises(DatasetFileNotFound, match=r"2 of 12 image file\(s\) missing: winoground-2-i1-c0"):
        load_dataset("winoground", tmp_path / "wg", check_images=True)


def test_example_scores_follow_the_definitions():
    # s[(image, caption)]
    perfect = {(0, 0): 0.9, (0, 1): 0.1, (1, 0): 0.2, (1, 1): 0.8}
    assert example_scores(perfect) == {"text": True, "image": True, "group": True}
    # image 0 prefers caption 1 -> text fails; but each caption still prefers its own image
    text_wrong = {(0, 0): 0.5, (0, 1): 0.6, (1, 0): 0.1, (1, 1): 0.9}
    assert example_scores(text_wrong) == {"text": False, "image": True, "group": False}
    # caption 0 prefers image 1 -> image fails; each image still prefers its own caption
    image_wrong = {(0, 0): 0.5, (0, 1): 0.1, (1, 0): 0.6, (1, 1): 0.9}
    assert example_scores(image_wrong) == {"text": True, "image": False, "group": False}
    ties = {(0, 0): 1.0, (0, 1): 1.0, (1, 0): 0.0, (1, 1): 1.0}
    assert example_scores(ties)["text"] is False  # strict comparison


def test_winoground_scores_aggregate_over_examples_and_tags():
    exs = load_winoground_root(FIX / "winoground")
    # id 0 perfect, id 1 text-only, id 2 says "yes" to everything (all ties)
    per_pair = {
        "0": {(0, 0): 0.9, (0, 1): 0.1, (1, 0): 0.2, (1, 1): 0.8},
        "1": {(0, 0): 0.5, (0, 1): 0.1, (1, 0): 0.6, (1, 1): 0.9},
        "2": {(0, 0): 1, (0, 1): 1, (1, 0): 1, (1, 1): 1},
    }
    scores = [per_pair[e.meta["winoground_id"]][e.meta["image_index"], e.meta["caption_index"]] for e in exs]
    res = winoground_scores(exs, scores)
    assert (res.text, res.image, res.group, res.n) == (2 / 3, 1 / 3, 1 / 3, 3)
    assert res.per_group["Noun"] == {"text": 0.5, "image": 0.5, "group": 0.5, "n": 2.0}
    assert res.per_example["1"] == {"text": True, "image": False, "group": False}
    # same result from an id -> score mapping, in any order
    by_id = {e.id: s for e, s in zip(exs, scores)}
    assert winoground_scores(list(reversed(exs)), by_id).per_example == res.per_example


def test_winoground_scores_reject_incomplete_input():
    exs = load_winoground_root(FIX / "winoground")
    with pytest.raises(ValueError, match=r"Winoground id 0: missing pairing\(s\) \(image, caption\) \[\(1, 1\)\]"):
        winoground_scores(exs[:3], [1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="got 2 scores for 12 examples"):
        winoground_scores(exs, [1.0, 0.0])
    with pytest.raises(ValueError, match="appears twice"):
        winoground_scores(exs[:4] + exs[:1], [1.0] * 5)


# --- SugarCREPE ------------------------------------------------------------------------------------


def test_sugarcrepe_fixture_gives_positive_and_negative_per_entry():
    exs = load_dataset("sugarcrepe", FIX / "sugarcrepe")
    assert len(exs) == 2 * 8  # 8 entries over 7 category files
    assert [e.group for e in exs[::2]] == ["replace_att", "replace_obj", "replace_obj", *CATEGORIES[2:]]
    pos, neg = exs[6], exs[7]  # replace_rel/0
    assert pos.id == "sugarcrepe-replace_rel-0-pos" and neg.id == "sugarcrepe-replace_rel-0-neg"
    assert (pos.answers, neg.answers) == (("yes",), ("no",))
    assert neg.query == 'Verify image matches text="A person carrying a skateboard down a street."'
    assert pos.image == neg.image == str(FIX / "sugarcrepe" / "val2017" / "000000087038.jpg")
    assert pos.meta["entry"] == neg.meta["entry"] == "replace_rel/0"
    # each side knows its pair's other caption (the fallback's CLIP baseline compares the two)
    assert pos.meta["other_caption"] == neg.meta["caption"] and neg.meta["other_caption"] == pos.meta["caption"]


def test_sugarcrepe_query_template_and_categories(tmp_path):
    exs = load_sugarcrepe(
        FIX / "sugarcrepe" / "data", tmp_path, categories=["swap_obj"], query_template="Does this show: {caption}?"
    )
    assert [e.query for e in exs] == [
        "Does this show: A cat sitting on a laptop.?",
        "Does this show: A laptop sitting on a cat.?",
    ]
    with pytest.raises(ValueError, match="unknown SugarCREPE categories \\['swap_rel'\\]"):
        load_sugarcrepe(FIX / "sugarcrepe" / "data", tmp_path, categories=["swap_rel"])


def test_sugarcrepe_missing_category_file(tmp_path):
    shutil.copytree(FIX / "sugarcrepe" / "data", tmp_path / "data")
    (tmp_path / "data" / "add_obj.json").unlink()
    with pytest.raises(DatasetFileNotFound, match=r"add_obj\.json: no such file; expected SugarCREPE's add_obj\.json"):
        load_sugarcrepe(tmp_path / "data", tmp_path)


def test_sugarcrepe_bad_entry_names_file_and_key(tmp_path):
    data = json.loads((FIX / "sugarcrepe" / "data" / "replace_obj.json").read_text())
    del data["1"]["negative_caption"]
    path = tmp_path / "replace_obj.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DatasetFormatError, match=r"replace_obj\.json: entry '1' is missing 'negative_caption'"):
        load_sugarcrepe_file(path, tmp_path)
    with pytest.warns(SkippedRowsWarning, match="skipped 1 bad row"):
        exs = load_sugarcrepe_file(path, tmp_path, skip_bad_rows=True)
    assert [e.id for e in exs] == ["sugarcrepe-replace_obj-0-pos", "sugarcrepe-replace_obj-0-neg"]
