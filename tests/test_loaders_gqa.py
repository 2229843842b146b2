"""GQA questions and scene graphs: the fixture files, the API box convention, and bad input."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
from PIL import Image

from vprl.data.loaders import DatasetFileNotFound, DatasetFormatError, SkippedRowsWarning
from vprl.data.loaders.gqa import (
    answer_type,
    is_balanced,
    load_gqa_questions,
    load_gqa_root,
    load_scene_graphs,
    require_scenes,
)

FIX = Path(__file__).parent / "fixtures" / "datasets" / "gqa"
QUESTIONS = FIX / "val_balanced_questions.json"
SCENES = FIX / "val_sceneGraphs.json"


def write(path: Path, obj: object) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def test_questions_fixture_reads_every_row_in_order():
    exs = load_gqa_questions(QUESTIONS, "imgs")
    raw = json.loads(QUESTIONS.read_text())
    assert [e.meta["questionId"] for e in exs] == list(raw)
    first = exs[0]
    assert first.id == "gqa-02930152"
    assert (first.task, first.dataset, first.query, first.answers) == ("vqa", "gqa", "Is the sky dark?", ("yes",))
    assert first.group == "verifyAttr"  # types.detailed, the question family
    assert first.image == str(Path("imgs") / "2354786.jpg")
    assert first.meta["fullAnswer"] == "Yes, the sky is dark."
    assert first.meta["groups"] == {"global": None, "local": "06-sky_dark"}
    assert first.meta["types"]["structural"] == "verify"
    # Example records cross processes as JSON, so meta must survive a round trip.
    assert json.loads(json.dumps(first.to_json()))["meta"] == first.meta


def test_image_pattern_and_dataset_name_are_configurable():
    exs = load_gqa_questions(QUESTIONS, "/w", image_pattern="scene_{image_id}.png", dataset="shapes")
    assert exs[0].image == str(Path("/w") / "scene_2354786.png")
    assert exs[0].id == "shapes-02930152" and exs[0].dataset == "shapes"


def test_scene_graphs_fixture_and_api_box():
    scenes = load_scene_graphs(SCENES)
    assert set(scenes) == {"2354786", "2375429"}
    cup = scenes["2375429"].objects["1001"]
    assert (cup.name, cup.attributes) == ("cup", ("white",))
    assert [(r.name, r.object) for r in cup.relations] == [("on", "1002"), ("to the right of", "1003")]
    # x=300, y=120 (top-left), 40x50, image height 375 -> bottom-left (left, lower, right, upper)
    assert cup.box(375) == (300, 375 - 170, 340, 375 - 120)
    assert scenes["2354786"].extra == {"location": "outdoors", "weather": "overcast"}
    # to_json reproduces the file entry exactly (the shapes world writes through it)
    assert {k: v.to_json() for k, v in scenes.items()} == json.loads(SCENES.read_text())


def test_require_scenes_names_images_without_a_scene(tmp_path):
    exs = load_gqa_questions(QUESTIONS, "imgs")
    scenes = load_scene_graphs(SCENES)
    require_scenes(exs, scenes)
    del scenes["2375429"]
    with pytest.raises(DatasetFormatError, match="2375429"):
        require_scenes(exs, scenes, where=str(SCENES))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s["2354786"]["objects"]["2486325"].pop("w"), "scene '2354786' object '2486325' is missing 'w'"),
        (lambda s: s["2375429"]["objects"]["1003"].pop("name"), "scene '2375429' object '1003' is missing 'name'"),
        (lambda s: s["2375429"]["objects"]["1001"].update(x="12"), "object '1001' has 'x' of type str"),
        (lambda s: s["2375429"].pop("height"), "scene '2375429' is missing 'height'"),
        (
            lambda s: s["2375429"]["objects"]["1002"]["relations"].append({"name": "near", "object": "999"}),
            "object '1002' relation 1 points to unknown object '999'",
        ),
        (lambda s: s["2375429"]["objects"]["1001"]["relations"][0].pop("object"), "relation 0 is missing 'object'"),
        (lambda s: s["2375429"]["objects"]["1001"].update(h=-3), "negative size"),
    ],
)
def test_corrupt_scene_graph_names_file_and_key_path(tmp_path, mutate, message):
    scenes = json.loads(SCENES.read_text())
    mutate(scenes)
    path = write(tmp_path / "val_sceneGraphs.json", scenes)
    with pytest.raises(DatasetFormatError) as err:
        load_scene_graphs(path)
    assert str(path) in str(err.value)
    assert message in str(err.value)


def test_scene_graph_bad_json_names_file_and_position(tmp_path):
    path = tmp_path / "val_sceneGraphs.json"
    path.write_text('{"1": {"width": 3,', encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=r"val_sceneGraphs\.json: not valid JSON \(line 1 column"):
        load_scene_graphs(path)


def test_skip_bad_scenes_warns_with_count(tmp_path):
    scenes = json.loads(SCENES.read_text())
    del scenes["2354786"]["objects"]["2486325"]["w"]
    path = write(tmp_path / "sg.json", scenes)
    with pytest.warns(SkippedRowsWarning, match="skipped 1 bad row") as rec:
        out = load_scene_graphs(path, skip_bad_rows=True)
    assert set(out) == {"2375429"}
    assert rec[0].message.count == 1 and "missing 'w'" in rec[0].message.reasons[0]


def test_missing_files_say_what_belongs_there(tmp_path):
    with pytest.raises(DatasetFileNotFound, match="expected a GQA questions file like val_balanced_questions.json"):
        load_gqa_questions(tmp_path / "nope.json", tmp_path)
    with pytest.raises(DatasetFileNotFound, match="expected a GQA scene-graph file like val_sceneGraphs.json"):
        load_scene_graphs(tmp_path / "nope.json")
    with pytest.raises(DatasetFileNotFound, match="train_balanced_questions.json"):
        load_gqa_root(tmp_path, "train")


def test_malformed_question_names_file_and_id(tmp_path):
    rows = json.loads(QUESTIONS.read_text())
    del rows["07333408"]["answer"]
    rows["07333409"]["types"] = {"semantic": "rel"}
    path = write(tmp_path / "val_balanced_questions.json", rows)
    with pytest.raises(
        DatasetFormatError, match=r"val_balanced_questions\.json: question '07333408' is missing 'answer'"
    ):
        load_gqa_questions(path, tmp_path)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        exs = load_gqa_questions(path, tmp_path, skip_bad_rows=True)
    assert len(exs) == 2
    [w] = [w.message for w in rec if isinstance(w.message, SkippedRowsWarning)]
    assert w.count == 2 and "types is missing 'detailed'" in w.reasons[1]


def test_unannotated_split_has_no_answers(tmp_path):
    rows = {"201307251": {"imageId": "n161313", "question": "Is it overcast?", "isBalanced": True}}
    (tmp_path / "questions").mkdir()
    write(tmp_path / "questions" / "submission_all_questions.json", rows)
    [ex] = load_gqa_root(tmp_path, "submission", balanced=False)
    assert ex.answers == () and ex.group == "" and ex.image == str(tmp_path / "images" / "n161313.jpg")


def test_top_level_must_be_an_object(tmp_path):
    path = write(tmp_path / "q.json", [1, 2])
    with pytest.raises(DatasetFormatError, match="expected a JSON object at the top level, got list"):
        load_gqa_questions(path, tmp_path)


def test_check_images_lists_missing_files(tmp_path):
    root = tmp_path / "gqa"
    shutil.copytree(FIX, root)
    (root / "images").mkdir()
    Image.new("RGB", (8, 6)).save(root / "images" / "2354786.jpg")
    assert len(load_gqa_root(root)) == 4  # lazy by default: no stat
    with pytest.raises(DatasetFileNotFound, match=r"2 of 4 image file\(s\) missing: gqa-07333408: .*2375429\.jpg"):
        load_gqa_root(root, check_images=True)
    Image.new("RGB", (8, 6)).save(root / "images" / "2375429.jpg")
    assert len(load_gqa_root(root, check_images=True)) == 4


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda row: row.update(isBalanced="yes"), r"question '\w+' has 'isBalanced' of type str, expected bool"),
        (lambda row: row["types"].pop("structural"), r"question '\w+' types is missing 'structural'"),
    ],
)
def test_what_the_official_metric_reads_is_checked_on_loading(tmp_path, mutate, message):
    """The official accuracy counts `isBalanced` questions and splits them by `types.structural`."""
    rows = json.loads(QUESTIONS.read_text())
    mutate(next(iter(rows.values())))
    with pytest.raises(DatasetFormatError, match=message):
        load_gqa_questions(write(tmp_path / "val_balanced_questions.json", rows), "imgs")
    exs = load_gqa_questions(QUESTIONS, "imgs")
    assert [is_balanced(e) for e in exs] == [True] * len(exs)
    assert [answer_type(e) for e in exs] == ["binary", "open", "open", "binary"]  # verify, query, query, verify
