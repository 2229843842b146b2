"""GQA in its official file formats: questions files and scene graphs.

Questions (`questions1.2.zip`: `val_balanced_questions.json`, `train_balanced_questions.json`,
`testdev_balanced_questions.json`, ...) are one JSON object keyed by question id::

    {"<questionId>": {"imageId", "question", "answer", "fullAnswer",
                      "types": {"structural", "semantic", "detailed"},
                      "groups": {"global", "local"}, "annotations", "semantic", "semanticStr",
                      "isBalanced", "equivalent", "entailed"}}

Scene graphs (`sceneGraphs.zip`: `train_sceneGraphs.json`, `val_sceneGraphs.json`)::

    {"<imageId>": {"width", "height", "objects": {"<objId>": {"name", "x", "y", "w", "h",
                   "attributes": [...], "relations": [{"name", "object"}]}}}}

with `x, y` the TOP-LEFT corner in pixels. `SceneObject.box` converts to the API's bottom-left
convention. Images live at `<images_dir>/<imageId>.jpg`; `image_pattern` changes that (the
shapes world writes `.png`).

The Example `group` is `types.detailed` (e.g. `typeVerifyC`, `stateChoose`, `companyVerify`): the
question family ViUniT samples "5 per group" from (102 groups in balanced-val, 105 in
balanced-train). `groups.global`/`groups.local` are instead GQA's answer-consistency groups
(hundreds of values, some null), useless for per-family sampling; they stay in `meta`.

This reader is also the shapes world's, so it takes `dataset=` for the Example's dataset name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vprl.data.boxes import box_from_xywh
from vprl.data.loaders._common import DatasetFormatError, check_image_files, first_existing, load_json, parse_rows
from vprl.data.loaders.rows import RowError, get_field, get_id, get_number, get_str
from vprl.data.records import Example

QUESTIONS_EXPECTED = "a GQA questions file like val_balanced_questions.json (from questions1.2.zip)"
SCENES_EXPECTED = "a GQA scene-graph file like val_sceneGraphs.json (from sceneGraphs.zip)"
DEFAULT_IMAGE_PATTERN = "{image_id}.jpg"
# Keys that become Example fields; everything else in a question row is kept verbatim in meta.
_PROMOTED = ("imageId", "question", "answer")


def _image_path(images_dir: str | Path, pattern: str, image_id: str) -> str:
    return str(Path(images_dir) / pattern.format(image_id=image_id))


def parse_question(
    qid: str, row: Any, images_dir: str | Path, image_pattern: str, dataset: str, require_answer: bool
) -> Example:
    """One questions-file entry as an Example; raises RowError naming the question id and key."""
    where = f"question '{qid}'"
    image_id = get_id(row, "imageId", where)
    question = get_str(row, "question", where)
    answers: tuple[str, ...] = ()
    if require_answer or "answer" in row:
        answers = (get_str(row, "answer", where, allow_empty=True),)
    group = ""
    if "types" in row:
        types = get_field(row, "types", where, dict)
        group = get_str(types, "detailed", f"{where} types")
        # The official eval splits accuracy into binary and open questions by this type.
        get_str(types, "structural", f"{where} types")
    elif require_answer:
        # Annotated splits always carry types; a missing family would break per-group sampling.
        raise RowError(f"{where} is missing 'types'")
    if "isBalanced" in row:
        get_field(row, "isBalanced", where, bool)  # the official accuracy counts balanced questions only
    meta = {k: v for k, v in row.items() if k not in _PROMOTED}
    meta["imageId"] = image_id
    meta["questionId"] = qid
    return Example(
        id=f"{dataset}-{qid}",
        dataset=dataset,
        task="vqa",
        query=question,
        image=_image_path(images_dir, image_pattern, image_id),
        answers=answers,
        group=group,
        meta=meta,
    )


def load_gqa_questions(
    questions_path: str | Path,
    images_dir: str | Path,
    *,
    image_pattern: str = DEFAULT_IMAGE_PATTERN,
    dataset: str = "gqa",
    require_answers: bool = True,
    skip_bad_rows: bool = False,
    check_images: bool = False,
) -> list[Example]:
    """Read a GQA questions file into `vqa` Examples, in file order.

    `require_answers=False` accepts the unannotated test/challenge/submission files (answers
    then stay empty). `image_pattern` is formatted with `image_id`. See `_common` for the
    bad-row and image-check rules.
    """
    data = load_json(questions_path, QUESTIONS_EXPECTED)
    out = parse_rows(
        data.items(),
        lambda item: parse_question(*item, images_dir, image_pattern, dataset, require_answers),
        questions_path,
        skip_bad_rows,
        f"GQA questions {Path(questions_path).name}",
        len(data),
    )
    if check_images:
        check_image_files(out)
    return out


def is_balanced(example: Example) -> bool:
    """Whether the official GQA evaluation counts this question (`isBalanced` of its questions-file
    row): it scores balanced questions only, even when the file holds others."""
    flag = example.meta.get("isBalanced")
    if not isinstance(flag, bool):
        raise ValueError(
            f"GQA example {example.id!r}: meta has no boolean 'isBalanced' (got {flag!r}); the official "
            "accuracy counts balanced questions only, so load the questions with vprl.data.loaders.gqa"
        )
    return flag


def answer_type(example: Example) -> str:
    """ "open" for a `query` question (its `types.structural`), "binary" for every other one (verify,
    logical, choose, compare): the split the official GQA evaluation reports."""
    types = example.meta.get("types")
    structural = types.get("structural") if isinstance(types, dict) else None
    if not isinstance(structural, str):
        raise ValueError(
            f"GQA example {example.id!r}: meta has no 'types.structural' (got {types!r}); the official "
            "binary/open split needs it, so load the questions with vprl.data.loaders.gqa"
        )
    return "open" if structural == "query" else "binary"


@dataclass(frozen=True)
class Relation:
    name: str
    object: str  # target object id, within the same scene


@dataclass(frozen=True)
class SceneObject:
    """One annotated object; `x, y` are the top-left corner in pixels, as in the file."""

    id: str
    name: str
    x: float
    y: float
    w: float
    h: float
    attributes: tuple[str, ...] = ()
    relations: tuple[Relation, ...] = ()

    def box(self, image_height: float) -> tuple[float, float, float, float]:
        """The box in the API convention `(left, lower, right, upper)`, origin at the bottom-left."""
        return box_from_xywh(self.x, self.y, self.w, self.h, image_height)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "x": self.x,
            "y": self.y,
            "w": self.w,
            "h": self.h,
            "attributes": list(self.attributes),
            "relations": [{"name": r.name, "object": r.object} for r in self.relations],
        }


@dataclass(frozen=True)
class SceneGraph:
    """One image's scene graph. `extra` keeps scene-level keys such as `location` and `weather`."""

    image_id: str
    width: float
    height: float
    objects: dict[str, SceneObject]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The GQA file form of this scene (inverse of the loader's parsing)."""
        out = {"width": self.width, "height": self.height, **self.extra}
        out["objects"] = {oid: obj.to_json() for oid, obj in self.objects.items()}
        return out


def _as_int_if_whole(v: float) -> float:
    # GQA stores integer pixels; keep them ints so a JSON round-trip reproduces the file.
    return int(v) if float(v).is_integer() else v


def parse_scene(image_id: str, row: Any) -> SceneGraph:
    """One scene-graph entry; raises RowError naming the scene, object and key that are wrong."""
    where = f"scene '{image_id}'"
    width = get_number(row, "width", where)
    height = get_number(row, "height", where)
    if width <= 0 or height <= 0:
        raise RowError(f"{where} has a non-positive size {width}x{height}")
    raw_objects = get_field(row, "objects", where, dict)
    objects: dict[str, SceneObject] = {}
    for oid, obj in raw_objects.items():
        owhere = f"{where} object '{oid}'"
        coords = {k: _as_int_if_whole(get_number(obj, k, owhere)) for k in ("x", "y", "w", "h")}
        if coords["w"] < 0 or coords["h"] < 0:
            raise RowError(f"{owhere} has a negative size w={coords['w']} h={coords['h']}")
        attrs = get_field(obj, "attributes", owhere, list) if "attributes" in obj else []
        for i, a in enumerate(attrs):
            if not isinstance(a, str):
                raise RowError(f"{owhere} attribute {i} is {type(a).__name__}, expected str")
        rels = get_field(obj, "relations", owhere, list) if "relations" in obj else []
        relations = tuple(
            Relation(get_str(r, "name", f"{owhere} relation {i}"), get_id(r, "object", f"{owhere} relation {i}"))
            for i, r in enumerate(rels)
        )
        objects[str(oid)] = SceneObject(
            id=str(oid), name=get_str(obj, "name", owhere), attributes=tuple(attrs), relations=relations, **coords
        )
    # Dangling relation targets would make the oracle backend fail later, far from the cause.
    for obj in objects.values():
        for i, rel in enumerate(obj.relations):
            if rel.object not in objects:
                raise RowError(f"{where} object '{obj.id}' relation {i} points to unknown object '{rel.object}'")
    extra = {k: v for k, v in row.items() if k not in ("width", "height", "objects")}
    return SceneGraph(image_id, _as_int_if_whole(width), _as_int_if_whole(height), objects, extra)


def load_scene_graphs(path: str | Path, *, skip_bad_rows: bool = False) -> dict[str, SceneGraph]:
    """Read and validate a GQA scene-graph file into `{imageId: SceneGraph}`.

    Errors name the file and key path, e.g.
    `val_sceneGraphs.json: scene '2354786' object '3' is missing 'w'`. With `skip_bad_rows=True`
    a bad scene is skipped whole (and counted in a `SkippedRowsWarning`).
    """
    data = load_json(path, SCENES_EXPECTED)
    scenes = parse_rows(
        data.items(),
        lambda item: parse_scene(str(item[0]), item[1]),
        path,
        skip_bad_rows,
        f"GQA scene graphs {Path(path).name}",
        len(data),
    )
    return {scene.image_id: scene for scene in scenes}


def require_scenes(examples: list[Example], scenes: dict[str, SceneGraph], where: str = "scene graphs") -> None:
    """Fail if any GQA example's image has no scene graph (the oracle backend needs one each)."""
    missing = sorted({ex.meta["imageId"] for ex in examples if ex.meta.get("imageId") not in scenes})
    if missing:
        raise DatasetFormatError(
            f"{where}: no scene for {len(missing)} image(s) used by the questions: {missing[:10]}"
        )


ANNOTATED_SPLITS = ("train", "val", "testdev")


def load_gqa_root(
    root: str | Path,
    split: str = "val",
    *,
    balanced: bool = True,
    questions_file: str | Path | None = None,
    images_dir: str | Path | None = None,
    image_pattern: str = DEFAULT_IMAGE_PATTERN,
    dataset: str = "gqa",
    require_answers: bool | None = None,
    skip_bad_rows: bool = False,
    check_images: bool = False,
) -> list[Example]:
    """The official layout: `<root>/<split>_balanced_questions.json` (or `_all_`, or the same under
    `<root>/questions/`), images in `<root>/images/`. Answers are required for the annotated splits
    (train, val, testdev) unless `require_answers` says otherwise. The train "all" questions ship
    as ten shards in a folder; pass each shard as `questions_file`."""
    root = Path(root)
    return load_gqa_questions(
        gqa_questions_path(root, split, balanced=balanced, questions_file=questions_file),
        Path(images_dir) if images_dir else root / "images",
        image_pattern=image_pattern,
        dataset=dataset,
        require_answers=split in ANNOTATED_SPLITS if require_answers is None else require_answers,
        skip_bad_rows=skip_bad_rows,
        check_images=check_images,
    )


def gqa_questions_path(
    root: str | Path, split: str = "val", *, balanced: bool = True, questions_file: str | Path | None = None, **_: Any
) -> Path:
    """The questions file `load_gqa_root` reads for these options (its other options are ignored), so
    that a cache of what was drawn from it can be keyed by the file (`vprl.data.loaders.sampling`)."""
    if questions_file:
        return Path(questions_file)
    root = Path(root)
    name = f"{split}_{'balanced' if balanced else 'all'}_questions.json"
    return first_existing([root / name, root / "questions" / name], f"the GQA questions file {name}")
