"""VQAv2 and OK-VQA: joining questions with annotations, COCO image naming, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vprl.data.loaders import DatasetFileNotFound, DatasetFormatError, SkippedRowsWarning
from vprl.data.loaders.vqav2 import load_vqa, load_vqa_root

FIX = Path(__file__).parent / "fixtures" / "datasets"
VQ = FIX / "vqav2" / "v2_OpenEnded_mscoco_val2014_questions.json"
VA = FIX / "vqav2" / "v2_mscoco_val2014_annotations.json"


def copy_vqav2(tmp_path: Path) -> tuple[dict, dict, Path, Path]:
    q, a = json.loads(VQ.read_text()), json.loads(VA.read_text())
    return q, a, tmp_path / VQ.name, tmp_path / VA.name


def dump(path: Path, obj: object) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def test_vqav2_fixture_keeps_all_ten_answers():
    exs = load_vqa_root(FIX / "vqav2", dataset="vqav2")
    assert [e.id for e in exs] == ["vqav2-262148000", "vqav2-262148001", "vqav2-393225000"]
    ex = exs[2]
    assert ex.task == "vqa" and ex.query == "What color is the bowl?"
    assert ex.answers == ("white",) * 9 + ("cream",)
    assert ex.group == "what color is the"
    assert ex.image == str(FIX / "vqav2" / "val2014" / "COCO_val2014_000000393225.jpg")
    assert ex.meta["multiple_choice_answer"] == "white" and ex.meta["answer_type"] == "other"
    assert len(ex.meta["answer_confidence"]) == 10


def test_okvqa_fixture_groups_by_question_type_and_keeps_raw_answers():
    exs = load_vqa_root(FIX / "okvqa", dataset="okvqa")
    assert [(e.id, e.group) for e in exs] == [("okvqa-2971475", "eight"), ("okvqa-3932435", "one")]
    assert exs[1].answers == ("toyota",) * 8 + ("honda",) * 2
    assert exs[1].meta["raw_answers"][0] == "Toyota"
    assert "multiple_choice_answer" not in exs[1].meta  # OK-VQA does not have one
    assert exs[0].image.endswith("val2014/COCO_val2014_000000297147.jpg")


def test_image_pattern_override(tmp_path):
    exs = load_vqa(VQ, VA, "/coco", image_pattern="{image_id}.jpg")
    assert exs[0].image == str(Path("/coco") / "262148.jpg")


def test_test_split_without_annotations(tmp_path):
    q, _, qp, _ = copy_vqav2(tmp_path)
    q["data_subtype"] = "test2015"
    dump(tmp_path / "v2_OpenEnded_mscoco_test2015_questions.json", q)
    exs = load_vqa(tmp_path / "v2_OpenEnded_mscoco_test2015_questions.json", None, tmp_path)
    assert all(e.answers == () and e.group == "" for e in exs)
    assert exs[0].image.endswith("COCO_test2015_000000262148.jpg")


def test_missing_files_name_the_official_file(tmp_path):
    with pytest.raises(
        DatasetFileNotFound, match=r"expected the VQAv2 questions file like v2_OpenEnded_mscoco_val2014"
    ):
        load_vqa_root(tmp_path, dataset="vqav2")
    shutil.copy(FIX / "okvqa" / "OpenEnded_mscoco_val2014_questions.json", tmp_path)
    with pytest.raises(
        DatasetFileNotFound,
        match=r"mscoco_val2014_annotations\.json: no such file; expected the OK-VQA annotations file like mscoco_val2014",
    ):
        load_vqa_root(tmp_path, dataset="okvqa")


@pytest.mark.parametrize(
    ("mutate", "bad_file", "message"),
    [
        (
            lambda q, a: q["questions"][1].pop("question"),
            "q",
            r"questions\[1\] \(question_id 262148001\) is missing 'question'",
        ),
        (lambda q, a: a["annotations"][2].pop("answers"), "q", r"annotations\[2\] of .* is missing 'answers'"),
        (lambda q, a: a["annotations"].pop(0), "q", r"questions\[0\] \(question_id 262148000\) has no annotation"),
        (lambda q, a: q["questions"].pop(0), "a", r"annotations\[0\] \(question_id 262148000\) has no question"),
        (lambda q, a: a["annotations"][1].update(image_id=5), "q", r"has image_id 5, but the question has 262148"),
        (
            lambda q, a: a["annotations"].append(dict(a["annotations"][0])),
            "a",
            r"annotations\[3\] repeats question_id",
        ),
        (lambda q, a: q["questions"][2].update(image_id="x"), "q", r"'image_id' of type str, expected int"),
    ],
)
def test_malformed_rows_name_file_and_row(tmp_path, mutate, bad_file, message):
    q, a, qp, ap = copy_vqav2(tmp_path)
    mutate(q, a)
    dump(qp, q), dump(ap, a)
    with pytest.raises(DatasetFormatError, match=message) as err:
        load_vqa(qp, ap, tmp_path)
    assert str(qp if bad_file == "q" else ap) in str(err.value)
    with pytest.warns(SkippedRowsWarning, match="skipped 1 bad row"):
        exs = load_vqa(qp, ap, tmp_path, skip_bad_rows=True)
    assert len(exs) == len(q["questions"]) - (bad_file == "q")


def test_top_level_questions_list_required(tmp_path):
    path = dump(tmp_path / "q.json", {"data_subtype": "val2014", "qs": []})
    with pytest.raises(DatasetFormatError, match=r"q\.json: the top-level object is missing 'questions'"):
        load_vqa(path, None, tmp_path)
