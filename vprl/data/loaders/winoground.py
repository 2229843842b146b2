"""Winoground in either of its releases on the Hugging Face Hub (facebook/winoground, gated).

- Today's release: `data/test-*.parquet`, one row per example with the columns `id`, `image_0`,
  `image_1` (image structs: the encoded file's `bytes` and a `path`), `caption_0`, `caption_1`,
  `tag`, `secondary_tag`, `num_main_preds`, `collapsed_tag`.
- The first release: `data/examples.jsonl` with the same keys, the images named by `image_0` and
  `image_1` as files `images/<name>.png` from `data/images.zip`.

Caption 0 describes image 0 and caption 1 image 1, with the same words in a different order.
Following ViUniT, each example becomes four `itm` items, one per (image i, caption j) pairing, with
the query `Verify image matches text="<caption j>"` and the answer "yes" iff i == j: 400 examples
give the 1600 pairings. `group` is `tag` (ViUniT groups results by it). `meta` keeps the Winoground
id and both indices so `winoground_scores` can rebuild the text/image/group scores.

The parquet's images are written out once, unchanged, as `images/ex_<id>_img_<i>.<format>` beside
the parquet file (the first release's names), because an `Example` names its image by path: the
sandboxed executor opens and hashes image files, and examples cross processes as JSON, where bytes
would not travel. A file already there with the same bytes is left alone, so a second load writes
nothing.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from vprl.data.loaders._common import (
    ITM_QUERY,
    BadRows,
    DatasetFileNotFound,
    DatasetFormatError,
    check_image_files,
    first_existing,
    progress,
)
from vprl.data.loaders.rows import RowError, get_field, get_id, get_str
from vprl.data.records import Example, read_jsonl

EXPECTED = "Winoground's examples.jsonl (from the facebook/winoground dataset's data/ folder)"
PARQUET_EXPECTED = (
    "Winoground from the facebook/winoground dataset: data/test-*.parquet (today's release) "
    "or data/examples.jsonl with data/images/ (the first)"
)
COLUMNS = ("id", "image_0", "image_1", "caption_0", "caption_1", "tag")
EXTRA = ("secondary_tag", "num_main_preds", "collapsed_tag")
IMAGE_SUFFIX = {"PNG": ".png", "JPEG": ".jpg", "WEBP": ".webp", "GIF": ".gif", "BMP": ".bmp", "TIFF": ".tif"}


def _pairings(
    wid: str,
    images: Sequence[str],
    names: Sequence[str],
    captions: Sequence[str],
    tag: str,
    extra: dict[str, Any],
    dataset: str,
    query_template: str,
) -> list[Example]:
    """The four items of one example, in the order i0c0, i0c1, i1c0, i1c1."""
    return [
        Example(
            id=f"{dataset}-{wid}-i{i}-c{j}",
            dataset=dataset,
            task="itm",
            query=query_template.format(caption=captions[j]),
            image=images[i],
            answers=("yes" if i == j else "no",),
            group=tag,
            meta={
                "winoground_id": wid,
                "image_index": i,
                "caption_index": j,
                "caption": captions[j],
                "other_caption": captions[1 - j],
                "image_name": names[i],
                "tag": tag,
                **extra,
            },
        )
        for i in (0, 1)
        for j in (0, 1)
    ]


def _text_fields(row: dict[str, Any], where: str, seen: dict[str, str]) -> tuple[str, list[str], str]:
    wid = get_id(row, "id", where)
    if wid in seen:
        raise RowError(f"{where} repeats id {wid} (first on {seen[wid]})")
    captions = [get_str(row, f"caption_{j}", where) for j in (0, 1)]
    return wid, captions, get_str(row, "tag", where)


def load_winoground(
    examples_path: str | Path,
    images_dir: str | Path,
    *,
    dataset: str = "winoground",
    image_ext: str = ".png",
    query_template: str = ITM_QUERY,
    skip_bad_rows: bool = False,
    check_images: bool = False,
) -> list[Example]:
    """Read the first release's `examples.jsonl` into four `itm` Examples per line."""
    path = first_existing([Path(examples_path)], EXPECTED)
    bad = BadRows(path, skip_bad_rows)
    # Lazily, so that errors surface in file order whichever kind they are.
    rows = read_jsonl(path, on_error=lambda lineno, reason: bad.handle(RowError(f"line {lineno}: {reason}")))
    out: list[Example] = []
    seen: dict[str, str] = {}
    for lineno, row in progress(rows, "Winoground examples"):
        where = f"line {lineno}"
        try:
            wid, captions, tag = _text_fields(row, where, seen)
            names = [get_str(row, f"image_{i}", where) for i in (0, 1)]
        except RowError as err:
            bad.handle(err)
            continue
        seen[wid] = where
        extra = {k: row[k] for k in EXTRA if k in row}
        images = [str(Path(images_dir) / f"{name}{image_ext}") for name in names]
        out += _pairings(wid, images, names, captions, tag, extra, dataset, query_template)
    bad.finish()
    if check_images:
        check_image_files(out)
    return out


def _parquet_rows(path: Path) -> Iterator[dict[str, Any]]:
    """The rows of one parquet file, a few at a time (the images make a row hundreds of kB)."""
    try:
        import pyarrow.parquet as pq
        from pyarrow import ArrowException
    except ImportError:
        raise ImportError(
            f"{path}: reading Winoground's parquet release needs pyarrow (pip install pyarrow)"
        ) from None
    try:
        parquet = pq.ParquetFile(path)
    except (ArrowException, OSError) as exc:
        raise DatasetFormatError(f"{path}: not a readable parquet file ({exc})") from None
    names = parquet.schema_arrow.names
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise DatasetFormatError(f"{path}: no column(s) {missing}; has {names}; expected {PARQUET_EXPECTED}")
    for batch in parquet.iter_batches(batch_size=16, columns=[c for c in (*COLUMNS, *EXTRA) if c in names]):
        yield from batch.to_pylist()


def _image_bytes(row: dict[str, Any], key: str, where: str) -> tuple[bytes, str]:
    """The encoded image of an image column and the file suffix of its format."""
    value = get_field(row, key, where, dict)
    data = value.get("bytes")
    if not isinstance(data, bytes) or not data:
        raise RowError(f"{where} has no image bytes in '{key}' (an image struct with 'bytes')")
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            kind = im.format or ""
    except (UnidentifiedImageError, OSError):
        raise RowError(f"{where} has '{key}' bytes that are no image PIL can read") from None
    return data, IMAGE_SUFFIX.get(kind, f".{kind.lower() or 'img'}")


def _write_once(path: Path, data: bytes) -> None:
    """Write `data` to `path` unless it already holds exactly that; through a temporary name, so
    that a reader never sees half an image (ranks may load the dataset at once)."""
    if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        raise DatasetFormatError(
            f"{path.parent}: cannot write Winoground's images there ({exc.strerror}); "
            "pass images_dir, a writable folder"
        ) from None


def load_winoground_parquet(
    paths: Sequence[str | Path],
    images_dir: str | Path,
    *,
    dataset: str = "winoground",
    query_template: str = ITM_QUERY,
    skip_bad_rows: bool = False,
    check_images: bool = False,
) -> list[Example]:
    """Read today's release (`data/test-*.parquet`, in file order) into four `itm` Examples per
    row, writing each row's two images into `images_dir` (module docstring)."""
    images_dir = Path(images_dir)
    out: list[Example] = []
    seen: dict[str, str] = {}
    for path in map(Path, paths):
        if not path.is_file():
            raise DatasetFileNotFound(f"{path}: no such file; expected {PARQUET_EXPECTED}")
        bad = BadRows(path, skip_bad_rows)
        for k, row in enumerate(progress(_parquet_rows(path), f"Winoground {path.name}"), start=1):
            where = f"row {k}"
            try:
                wid, captions, tag = _text_fields(row, where, seen)
                encoded = [_image_bytes(row, f"image_{i}", where) for i in (0, 1)]
            except RowError as err:
                bad.handle(err)
                continue
            seen[wid] = f"{path.name} {where}"
            names = [f"ex_{wid}_img_{i}" for i in (0, 1)]
            images_dir.mkdir(parents=True, exist_ok=True)
            images = []
            for name, (data, suffix) in zip(names, encoded):
                _write_once(images_dir / f"{name}{suffix}", data)
                images.append(str(images_dir / f"{name}{suffix}"))
            extra = {key: row[key] for key in EXTRA if row.get(key) is not None}
            out += _pairings(wid, images, names, captions, tag, extra, dataset, query_template)
        bad.finish()
    if check_images:
        check_image_files(out)
    return out


def find_release(root: Path) -> tuple[str, list[Path]]:
    """("jsonl", [examples.jsonl]) for the first release, ("parquet", [shards]) for today's: the
    first release wins where both are there, as it did before the parquet one was read."""
    for path in (root / "examples.jsonl", root / "data" / "examples.jsonl"):
        if path.is_file():
            return "jsonl", [path]
    for folder in (root / "data", root):
        shards = sorted(folder.glob("test-*.parquet"))
        if shards:
            return "parquet", shards
    looked = ", ".join(str(p) for p in (root / "examples.jsonl", root / "data" / "examples.jsonl"))
    raise DatasetFileNotFound(
        f"{root / 'data'}: no test-*.parquet or examples.jsonl; expected {PARQUET_EXPECTED} "
        f"(looked in: {looked}, {root / 'data' / 'test-*.parquet'}, {root / 'test-*.parquet'})"
    )


def load_winoground_root(
    root: str | Path,
    split: str = "test",
    *,
    examples_file: str | Path | None = None,
    images_dir: str | Path | None = None,
    image_ext: str = ".png",
    query_template: str = ITM_QUERY,
    skip_bad_rows: bool = False,
    check_images: bool = False,
) -> list[Example]:
    """Winoground has one split, `test`. Reads `examples.jsonl` (in `<root>` or `<root>/data`) with
    the images in the `images/` folder beside it, else `test-*.parquet` (in `<root>/data` or
    `<root>`) with its images written to the `images/` folder beside it; `images_dir` moves either."""
    if split != "test":
        raise ValueError(f"winoground has only the 'test' split, got {split!r}")
    if examples_file:
        kind, paths = ("parquet" if Path(examples_file).suffix == ".parquet" else "jsonl"), [Path(examples_file)]
    else:
        kind, paths = find_release(Path(root))
    images = Path(images_dir) if images_dir else paths[0].parent / "images"
    if kind == "parquet":
        return load_winoground_parquet(
            paths,
            images,
            query_template=query_template,
            skip_bad_rows=skip_bad_rows,
            check_images=check_images,
        )
    return load_winoground(
        paths[0],
        images,
        image_ext=image_ext,
        query_template=query_template,
        skip_bad_rows=skip_bad_rows,
        check_images=check_images,
    )
