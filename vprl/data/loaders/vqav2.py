"""VQAv2 and OK-VQA in their official file formats (both use the VQA API's JSON layout).

Questions: `{"data_subtype": "val2014", "questions": [{"image_id", "question", "question_id"}]}`
(`v2_OpenEnded_mscoco_val2014_questions.json`; OK-VQA: `OpenEnded_mscoco_val2014_questions.json`).
Annotations: `{"annotations": [{"question_id", "image_id", "question_type", "answer_type",
"multiple_choice_answer", "answers": [{"answer", "answer_confidence", "answer_id"} x 10]}]}`
(`v2_mscoco_val2014_annotations.json`; OK-VQA: `mscoco_val2014_annotations.json`).
Images use COCO naming, `COCO_val2014_%012d.jpg`; both datasets use COCO val2014 for val.
VQAv2's test splits are COCO's 2015 test images: `test` (`..._test2015_questions.json`) and
`test-dev` (`..._test-dev2015_questions.json`, a subset of test2015), both without annotations and
both with their images in `test2015/` as `COCO_test2015_%012d.jpg`.

All ten annotator answers are kept (VQA soft accuracy needs them); `group` is `question_type`
(VQAv2: the question's first words, e.g. "what color is the"; OK-VQA: its knowledge category
code, "one" ... "ten", "other"). `multiple_choice_answer` (VQAv2 only) goes to meta when present.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vprl.data.loaders._common import BadRows, DatasetFormatError, check_image_files, load_json, progress
from vprl.data.loaders.rows import RowError, get_field, get_id, get_str
from vprl.data.records import Example

FILES = {
    "vqav2": ("v2_OpenEnded_mscoco_{subtype}_questions.json", "v2_mscoco_{subtype}_annotations.json"),
    "okvqa": ("OpenEnded_mscoco_{subtype}_questions.json", "mscoco_{subtype}_annotations.json"),
}
# split -> (the files' data_subtype, the COCO image set holding its images)
SPLITS = {
    "vqav2": {
        "train": ("train2014", "train2014"),
        "val": ("val2014", "val2014"),
        "test": ("test2015", "test2015"),
        "test-dev": ("test-dev2015", "test2015"),
    },
    "okvqa": {"train": ("train2014", "train2014"), "val": ("val2014", "val2014")},
}
# The data_subtype a questions file names -> the image set its images are in.
IMAGE_SETS = {subtype: images for splits in SPLITS.values() for subtype, images in splits.values()}
_NAMES = {"vqav2": "VQAv2", "okvqa": "OK-VQA"}


def _index_annotations(rows: list[Any], bad: BadRows) -> dict[str, tuple[int, dict[str, Any]]]:
    """question_id -> (position in the file, annotation); a repeated question_id is a bad row."""
    out: dict[str, tuple[int, dict[str, Any]]] = {}
    for i, row in enumerate(rows):
        try:
            qid = get_id(row, "question_id", f"annotations[{i}]")
            if qid in out:
                raise RowError(f"annotations[{i}] repeats question_id {qid} (first at [{out[qid][0]}])")
            out[qid] = (i, row)
        except RowError as err:
            bad.handle(err)
    return out


def _parse_annotation(ann: dict[str, Any], where: str) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The annotator answers (all of them, in file order) and the annotation's meta fields."""
    answers = get_field(ann, "answers", where, list)
    if not answers:
        raise RowError(f"{where} has an empty 'answers' list")
    texts = tuple(get_str(a, "answer", f"{where} answers[{i}]", allow_empty=True) for i, a in enumerate(answers))
    meta: dict[str, Any] = {
        "question_type": get_str(ann, "question_type", where),
        "answer_confidence": [a.get("answer_confidence") for a in answers],
    }
    # VQAv2 has both; OK-VQA files carry answer_type but no multiple_choice_answer.
    for key in ("answer_type", "multiple_choice_answer"):
        if key in ann:
            meta[key] = get_str(ann, key, where, allow_empty=True)
    # OK-VQA v1.1 also stores each annotator's raw text; keep it only where the file has it.
    raws = [a.get("raw_answer") for a in answers]
    if any(r is not None for r in raws):
        meta["raw_answers"] = raws
    return texts, meta


def load_vqa(
    questions_path: str | Path,
    annotations_path: str | Path | None,
    images_dir: str | Path,
    *,
    dataset: str = "vqav2",
    image_pattern: str | None = None,
    skip_bad_rows: bool = False,
    check_images: bool = False,
) -> list[Example]:
    """Join a VQA-format questions file with its annotations into `vqa` Examples (question order).

    `annotations_path=None` reads an unannotated test split (answers stay empty, group "").
    `image_pattern` is formatted with `image_id`; by default it is COCO naming built from the
    questions file's `data_subtype` (e.g. `COCO_val2014_{image_id:012d}.jpg`).
    A question without an annotation, an annotation without a question, and an image_id that
    differs between the two are all bad rows.
    """
    label = _NAMES.get(dataset, dataset)
    q_name, a_name = FILES.get(dataset, FILES["vqav2"])
    qdata = load_json(questions_path, f"the {label} questions file like {q_name.format(subtype='val2014')}")
    questions = get_field_file(qdata, "questions", questions_path)
    if image_pattern is None:
        subtype = qdata.get("data_subtype", "val2014")
        image_pattern = f"COCO_{IMAGE_SETS.get(subtype, subtype)}_{{image_id:012d}}.jpg"

    annotations: dict[str, tuple[int, dict[str, Any]]] = {}
    bad_a = None
    if annotations_path is not None:
        adata = load_json(annotations_path, f"the {label} annotations file like {a_name.format(subtype='val2014')}")
        bad_a = BadRows(annotations_path, skip_bad_rows)
        annotations = _index_annotations(get_field_file(adata, "annotations", annotations_path), bad_a)

    bad_q = BadRows(questions_path, skip_bad_rows)
    out: list[Example] = []
    seen: set[str] = set()
    for i, row in progress(enumerate(questions), f"{label} questions", len(questions)):
        where = f"questions[{i}]"
        try:
            qid = get_id(row, "question_id", where)
            where = f"questions[{i}] (question_id {qid})"
            if qid in seen:
                raise RowError(f"{where} repeats an earlier question_id")
            seen.add(qid)
            image_id = int(get_field(row, "image_id", where, int))
            meta: dict[str, Any] = {"question_id": qid, "image_id": image_id}
            answers: tuple[str, ...] = ()
            group = ""
            if annotations_path is not None:
                if qid not in annotations:
                    raise RowError(f"{where} has no annotation in {Path(annotations_path).name}")
                ai, ann = annotations[qid]
                awhere = f"annotations[{ai}] of {Path(annotations_path).name} (question_id {qid})"
                if get_field(ann, "image_id", awhere, int) != image_id:
                    raise RowError(f"{awhere} has image_id {ann['image_id']}, but the question has {image_id}")
                answers, ann_meta = _parse_annotation(ann, awhere)
                group = ann_meta["question_type"]
                meta.update(ann_meta)
            out.append(
                Example(
                    id=f"{dataset}-{qid}",
                    dataset=dataset,
                    task="vqa",
                    query=get_str(row, "question", where),
                    image=str(Path(images_dir) / image_pattern.format(image_id=image_id)),
                    answers=answers,
                    group=group,
                    meta=meta,
                )
            )
        except RowError as err:
            bad_q.handle(err)
    if bad_a is not None:
        # Annotations nobody asked for mean the two files do not belong together (or a split mix-up).
        for qid, (ai, _) in annotations.items():
            if qid not in seen:
                bad_a.handle(
                    RowError(f"annotations[{ai}] (question_id {qid}) has no question in {Path(questions_path).name}")
                )
        bad_a.finish()
    bad_q.finish()
    if check_images:
        check_image_files(out)
    return out


def get_field_file(data: dict[str, Any], key: str, path: str | Path) -> list[Any]:
    """A top-level list such as `questions` or `annotations`; a wrong shape is a file-level error."""
    try:
        return get_field(data, key, "the top-level object", list)
    except RowError as err:
        raise DatasetFormatError(f"{path}: {err}") from None


def load_vqa_root(
    root: str | Path,
    split: str = "val",
    *,
    dataset: str = "vqav2",
    questions_file: str | Path | None = None,
    annotations_file: str | Path | None = None,
    images_dir: str | Path | None = None,
    image_pattern: str | None = None,
    skip_bad_rows: bool = False,
    check_images: bool = False,
) -> list[Example]:
    """Load a split (`SPLITS`) from the official layout: `<root>/<questions file>`, `<root>/<annotations
    file>`, images in `<root>/<image set>/`. Any of the three can be overridden; the test splits have
    no annotations file."""
    root = Path(root)
    q_name, a_name = FILES[dataset]
    if split not in SPLITS[dataset]:
        raise DatasetFormatError(
            f"{_NAMES[dataset]} has no split {split!r}; its splits are {', '.join(SPLITS[dataset])}"
        )
    subtype, image_set = SPLITS[dataset][split]
    q_path = Path(questions_file) if questions_file else root / q_name.format(subtype=subtype)
    if annotations_file:
        a_path: Path | None = Path(annotations_file)
    else:
        a_path = None if split.startswith("test") else root / a_name.format(subtype=subtype)
    return load_vqa(
        q_path,
        a_path,
        Path(images_dir) if images_dir else root / image_set,
        dataset=dataset,
        image_pattern=image_pattern,
        skip_bad_rows=skip_bad_rows,
        check_images=check_images,
    )
