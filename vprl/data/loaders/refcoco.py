"""RefCOCO, RefCOCO+ and RefCOCOg in the official `refer` layout.

Per dataset folder (`refcoco/`, `refcoco+/`, `refcocog/`):

* `refs(unc).p` (RefCOCO, RefCOCO+) or `refs(umd).p` / `refs(google).p` (RefCOCOg): a pickled
  list of `{"ref_id", "ann_id", "image_id", "split", "category_id", "file_name",
  "sentences": [{"sent", "raw", "tokens", "sent_id"}]}`. A JSON file with the same structure
  (`refs(unc).json`) is accepted too, so generated data (the shapes world) needs no pickle.
* `instances.json`: COCO format; `images` (id, width, height, file_name), `annotations`
  (id, image_id, bbox `[x, y, w, h]` with a TOP-LEFT origin, category_id), `categories`.

COCO's train2014 images sit in `images/train2014` under the root, or where refer's own code looks
(`images/mscoco/images/train2014`, its README's "add mscoco into images/" with COCO's zip inside).

One `grounding` Example per sentence. `box` is the referred annotation's box converted to the API
convention `(left, lower, right, upper)` with the origin at the bottom-left, using the image height.
`group` is the COCO category name.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vprl.data.boxes import box_from_xywh
from vprl.data.loaders._common import (
    DatasetFormatError,
    check_image_files,
    first_existing,
    load_json,
    parse_rows,
    require_file,
)
from vprl.data.loaders.rows import RowError, get_field, get_id, get_number, get_str
from vprl.data.records import Example

# (folder, refs file stem) per dataset name; RefCOCOg defaults to the umd partition (train/val/test).
LAYOUT = {"refcoco": ("refcoco", "unc"), "refcoco+": ("refcoco+", "unc"), "refcocog": ("refcocog", "umd")}
SPLITS = {"unc": ("train", "val", "testA", "testB"), "umd": ("train", "val", "test"), "google": ("train", "val")}
INSTANCES_EXPECTED = "the COCO-format instances.json that ships beside the refs file"
# The images folder under the root, first found wins: ours, then refer.py's IMAGE_DIR for the COCO sets.
IMAGE_DIRS = (Path("images") / "train2014", Path("images") / "mscoco" / "images" / "train2014")


class _NoGlobalsUnpickler(pickle.Unpickler):
    """The refs files are plain lists/dicts/strings/ints: refuse any class or function reference,
    so a tampered file cannot run code when loaded."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refuses global {module}.{name}: RefCOCO refs hold only plain data")


def load_refs(path: str | Path) -> list[dict[str, Any]]:
    """Read a refs file: `.json`, or the official pickle (`refs(unc).p`).

    Pickle is accepted here only because it is the dataset's own distribution format; everything
    we write ourselves is JSON.
    """
    path = require_file(path, "a RefCOCO refs file like refs(unc).p or refs(umd).p (or the same list as .json)")
    if path.suffix == ".json":
        refs = load_json(path, "a RefCOCO refs list", top=list)
    else:
        try:
            with open(path, "rb") as fh:
                # Python 2 byte strings in the official pickles are decoded as UTF-8 (ASCII in practice).
                refs = _NoGlobalsUnpickler(fh, encoding="utf-8").load()
        except (pickle.UnpicklingError, EOFError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            raise DatasetFormatError(f"{path}: not a readable RefCOCO refs pickle ({exc})") from None
    if not isinstance(refs, list):
        raise DatasetFormatError(f"{path}: expected a list of refs at the top level, got {type(refs).__name__}")
    return refs


def _index_instances(path: Path) -> tuple[dict[str, dict], dict[str, dict], dict[str, str]]:
    """images by id, annotations by id, category names by id; a bad entry is a file-level error."""
    data = load_json(path, INSTANCES_EXPECTED)
    tables: dict[str, dict[str, Any]] = {}
    for key in ("images", "annotations", "categories"):
        try:
            rows = get_field(data, key, "the top-level object", list)
            tables[key] = {get_id(r, "id", f"{key}[{i}]"): r for i, r in enumerate(rows)}
        except RowError as err:
            raise DatasetFormatError(f"{path}: {err}") from None
    names = {}
    for cid, cat in tables["categories"].items():
        try:
            names[cid] = get_str(cat, "name", f"category {cid}")
        except RowError as err:
            raise DatasetFormatError(f"{path}: {err}") from None
    return tables["images"], tables["annotations"], names


def coco_box_to_api(bbox: Sequence[float], image_height: float) -> tuple[float, float, float, float]:
    """COCO `[x, y, w, h]` (top-left origin) -> API `(left, lower, right, upper)` (bottom-left origin)."""
    x, y, w, h = (float(v) for v in bbox)
    return box_from_xywh(x, y, w, h, image_height)


def _parse_ref(i: int, ref: Any, images: dict, anns: dict, cats: dict, where_ann: str) -> tuple[dict, list]:
    where = f"refs[{i}]"
    ref_id = get_id(ref, "ref_id", where)
    where = f"refs[{i}] (ref_id {ref_id})"
    ann_id = get_id(ref, "ann_id", where)
    image_id = get_id(ref, "image_id", where)
    if ann_id not in anns:
        raise RowError(f"{where} refers to annotation {ann_id}, which is not in {where_ann}")
    ann = anns[ann_id]
    awhere = f"annotation {ann_id} of {where_ann}"
    if get_id(ann, "image_id", awhere) != image_id:
        raise RowError(f"{where} has image_id {image_id} but its {awhere} has image_id {ann['image_id']}")
    if image_id not in images:
        raise RowError(f"{where} refers to image {image_id}, which is not in {where_ann}")
    image = images[image_id]
    iwhere = f"image {image_id} of {where_ann}"
    height = get_number(image, "height", iwhere)
    bbox = get_field(ann, "bbox", awhere, list)
    if len(bbox) != 4 or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in bbox):
        raise RowError(f"{awhere} has bbox {bbox!r}, expected four numbers [x, y, w, h]")
    category_id = get_id(ref, "category_id", where)
    info = {
        "ref_id": ref_id,
        "ann_id": ann_id,
        "image_id": image_id,
        "split": get_str(ref, "split", where),
        "category_id": category_id,
        "category": cats.get(category_id, ""),
        "bbox_xywh": list(bbox),
        "width": get_number(image, "width", iwhere),
        "height": height,
        "file_name": get_str(image, "file_name", iwhere),
    }
    if not info["category"]:
        raise RowError(f"{where} has category_id {category_id}, which is not in {where_ann}")
    sentences = get_field(ref, "sentences", where, list)
    if not sentences:
        raise RowError(f"{where} has no sentences")
    sents = [
        (get_id(s, "sent_id", f"{where} sentences[{k}]"), get_str(s, "sent", f"{where} sentences[{k}]"), s)
        for k, s in enumerate(sentences)
    ]
    return info, sents


def load_refcoco(
    refs_path: str | Path,
    instances_path: str | Path,
    images_dir: str | Path,
    *,
    dataset: str = "refcoco",
    splits: Sequence[str] | None = None,
    skip_bad_rows: bool = False,
    check_images: bool = False,
) -> list[Example]:
    """One `grounding` Example per referring sentence, for refs whose `split` is in `splits`
    (None = all). Image paths are `<images_dir>/<instances image file_name>`."""
    refs = load_refs(refs_path)
    instances_path = Path(instances_path)
    images, anns, cats = _index_instances(require_file(instances_path, INSTANCES_EXPECTED))
    wanted = set(splits) if splits is not None else None
    seen: dict[str, str] = {}  # sent_id -> ref_id; Example ids are built from sent_id

    def parse(item: tuple[int, Any]) -> list[Example]:
        i, ref = item
        info, sents = _parse_ref(i, ref, images, anns, cats, instances_path.name)
        if wanted is not None and info["split"] not in wanted:
            return []
        dup = next((sid for sid, _, _ in sents if sid in seen), None)
        if dup is not None:
            raise RowError(f"refs[{i}] (ref_id {info['ref_id']}) repeats sent_id {dup} of ref_id {seen[dup]}")
        seen.update({sid: info["ref_id"] for sid, _, _ in sents})
        box = coco_box_to_api(info["bbox_xywh"], info["height"])
        return [
            Example(
                id=f"{dataset}-{sent_id}",
                dataset=dataset,
                task="grounding",
                query=sent,
                image=str(Path(images_dir) / info["file_name"]),
                box=box,
                group=info["category"],
                meta={**info, "sent_id": sent_id, "raw": raw.get("raw", sent)},
            )
            for sent_id, sent, raw in sents
        ]

    per_ref = parse_rows(list(enumerate(refs)), parse, refs_path, skip_bad_rows, f"{dataset} refs")
    out = [example for examples in per_ref for example in examples]
    if check_images:
        check_image_files(out)
    return out


def load_refcoco_root(
    root: str | Path,
    split: str = "val",
    *,
    dataset: str = "refcoco",
    split_by: str | None = None,
    refs_file: str | Path | None = None,
    instances_file: str | Path | None = None,
    images_dir: str | Path | None = None,
    skip_bad_rows: bool = False,
    check_images: bool = False,
) -> list[Example]:
    """The `refer` layout: `<root>/<dataset>/refs(<split_by>).p` (or `.json`) and
    `<root>/<dataset>/instances.json`, COCO train2014 images in `<root>/images/train2014` or
    `<root>/images/mscoco/images/train2014` (`images_folder`).
    `split="all"` loads every split; valid splits depend on `split_by` (unc: train/val/testA/testB,
    umd: train/val/test, google: train/val)."""
    folder, default_by = LAYOUT[dataset]
    split_by = split_by or default_by
    if split_by not in SPLITS:
        raise ValueError(f"{dataset}: unknown split_by {split_by!r}; valid: {sorted(SPLITS)}")
    if split != "all" and split not in SPLITS[split_by]:
        raise ValueError(f"{dataset} ({split_by}): unknown split {split!r}; valid: {[*SPLITS[split_by], 'all']}")
    base = Path(root) / folder
    if refs_file:
        refs_path = Path(refs_file)
    else:
        stem = f"refs({split_by})"
        refs_path = first_existing(
            [base / f"{stem}.p", base / f"{stem}.json"], f"{dataset}'s {stem}.p from the refer data release"
        )
    return load_refcoco(
        refs_path,
        Path(instances_file) if instances_file else base / "instances.json",
        Path(images_dir) if images_dir else images_folder(root),
        dataset=dataset,
        splits=None if split == "all" else [split],
        skip_bad_rows=skip_bad_rows,
        check_images=check_images,
    )


def images_folder(root: str | Path) -> Path:
    """The first of `IMAGE_DIRS` under `root` that is a folder. With neither there, the first: images
    are not looked at while loading (`_common`), and a missing one is reported with this path."""
    found = [Path(root) / rel for rel in IMAGE_DIRS if (Path(root) / rel).is_dir()]
    return found[0] if found else Path(root) / IMAGE_DIRS[0]
