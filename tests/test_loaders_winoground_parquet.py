"""Winoground's current Hub release: `data/test-*.parquet` with both images as columns.

The fixture is written here in that release's column layout (`id`, `image_0`/`image_1` as image
structs holding the encoded file's bytes and a path, `caption_0`/`caption_1`, `tag`,
`secondary_tag`, `num_main_preds`, `collapsed_tag`), from the captions of the first release's
fixture and small generated images.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from vprl.data.loaders import DatasetFormatError, SkippedRowsWarning, load_dataset

FIX = Path(__file__).parent / "fixtures" / "datasets" / "winoground"
ROWS = [json.loads(line) for line in (FIX / "data" / "examples.jsonl").read_text().splitlines()]
IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
SCHEMA = pa.schema(
    [
        ("id", pa.int32()),
        ("image_0", IMAGE),
        ("image_1", IMAGE),
        ("caption_0", pa.string()),
        ("caption_1", pa.string()),
        ("tag", pa.string()),
        ("secondary_tag", pa.string()),
        ("num_main_preds", pa.int32()),
        ("collapsed_tag", pa.string()),
    ]
)


def encoded(color: tuple[int, int, int], fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (6, 4), color).save(buf, format=fmt)
    return buf.getvalue()


def hub_rows() -> list[dict]:
    return [
        {
            **{k: v for k, v in row.items() if k not in ("image_0", "image_1")},
            **{
                f"image_{i}": {"bytes": encoded((40 * k, 90 * i, 7)), "path": f"{row[f'image_{i}']}.png"}
                for i in (0, 1)
            },
        }
        for k, row in enumerate(ROWS)
    ]


def write_release(root: Path, rows: list[dict], shards: int = 2, schema: pa.Schema = SCHEMA) -> list[Path]:
    """The Hub's `data/test-0000k-of-0000n.parquet` files, rows split across `shards`."""
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(shards):
        part = rows[s::shards] if shards > 1 else rows
        path = data / f"test-{s:05d}-of-{shards:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(part, schema=schema), path)
        paths.append(path)
    return paths


def test_parquet_release_loads_like_the_first_release(tmp_path):
    """The same examples as from examples.jsonl, the images written beside the parquet files once,
    byte for byte, under the first release's names."""
    write_release(tmp_path, hub_rows(), shards=1)
    exs = load_dataset("winoground", tmp_path, check_images=True)
    images = tmp_path / "data" / "images"
    first = load_dataset("winoground", FIX, images_dir=images)
    assert exs == first  # ids, queries, answers, tags, meta and image paths all agree
    assert Path(exs[2].image) == images / "ex_0_img_1.png"
    assert Path(exs[2].image).read_bytes() == hub_rows()[0]["image_1"]["bytes"]
    with Image.open(exs[-1].image) as im:
        assert im.getpixel((0, 0)) == (80, 90, 7)
    stamps = {p: p.stat().st_mtime_ns for p in images.iterdir()}
    assert len(stamps) == 6 and load_dataset("winoground", tmp_path) == exs
    assert {p: p.stat().st_mtime_ns for p in images.iterdir()} == stamps  # a second load writes nothing


def test_parquet_shards_are_read_in_order_and_jpeg_keeps_its_format(tmp_path):
    rows = hub_rows()
    rows[1]["image_0"]["bytes"] = encoded((1, 2, 3), "JPEG")
    write_release(tmp_path, rows, shards=2)
    exs = load_dataset("winoground", tmp_path)
    # shard 0 holds rows 0 and 2, shard 1 row 1
    assert [e.meta["winoground_id"] for e in exs[::4]] == ["0", "2", "1"]
    assert exs[8].image.endswith("ex_1_img_0.jpg") and exs[10].image.endswith("ex_1_img_1.png")
    assert exs[8].meta["secondary_tag"] == "Symbolic" and exs[8].meta["num_main_preds"] == 1


def test_parquet_bad_rows_name_file_row_and_column(tmp_path):
    from vprl.data.loaders.winoground import load_winoground_parquet

    rows = hub_rows()
    rows[1]["image_1"] = {"bytes": None, "path": "ex_1_img_1.png"}
    rows[2]["image_0"] = {"bytes": b"not an image", "path": None}
    [path] = write_release(tmp_path, rows, shards=1)
    with pytest.raises(
        DatasetFormatError, match=r"test-00000-of-00001\.parquet: row 2 has no image bytes in 'image_1'"
    ):
        load_winoground_parquet([path], tmp_path / "images")
    with pytest.warns(SkippedRowsWarning) as rec:
        exs = load_winoground_parquet([path], tmp_path / "images", skip_bad_rows=True)
    assert [e.meta["winoground_id"] for e in exs[::4]] == ["0"]
    [w] = [r.message for r in rec]
    assert w.count == 2 and w.reasons[1] == "row 3 has 'image_0' bytes that are no image PIL can read"


def test_parquet_without_a_column_or_not_parquet_at_all(tmp_path):
    schema = pa.schema([f for f in SCHEMA if f.name != "caption_1"])
    rows = [{k: v for k, v in r.items() if k != "caption_1"} for r in hub_rows()]
    [path] = write_release(tmp_path / "a", rows, shards=1, schema=schema)
    with pytest.raises(DatasetFormatError, match=r"\.parquet: no column\(s\) \['caption_1'\]; has \['id', "):
        load_dataset("winoground", tmp_path / "a")
    bad = tmp_path / "b" / "data" / "test-00000-of-00001.parquet"
    bad.parent.mkdir(parents=True)
    bad.write_text("id,caption_0\n")
    with pytest.raises(DatasetFormatError, match=r"test-00000-of-00001\.parquet: not a readable parquet file"):
        load_dataset("winoground", tmp_path / "b")
