"""Winoground in its official format: `examples.jsonl` plus `images/<image name>.png`.

Each line is `{"id", "image_0", "image_1", "caption_0", "caption_1", "tag", "secondary_tag",
"num_main_preds", "collapsed_tag"}`. Caption 0 describes image 0 and caption 1 image 1, with the
same words in a different order. Following ViUniT, each line becomes four `itm` items, one per
(image i, caption j) pairing, with the query `Verify image matches text="<caption j>"` and the
answer "yes" iff i == j: 400 lines give the 1600 pairings. `group` is `tag` (ViUniT groups results
by it). `meta` keeps the Winoground id and both indices so `winoground_scores` can rebuild the
text/image/group scores from per-item scores.
"""

from __future__ import annotations

from pathlib import Path

from data.loaders._common import ITM_QUERY, BadRows, check_image_files, first_existing, progress
from data.loaders.rows import RowError, get_id, get_str
from data.records import Example, read_jsonl

EXPECTED = "Winoground's examples.jsonl (from the facebook/winoground dataset's data/ folder)"


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
    """Read `examples.jsonl` into four `itm` Examples per line (pairing order i0c0, i0c1, i1c0, i1c1)."""
    path = first_existing([Path(examples_path)], EXPECTED)
    bad = BadRows(path, skip_bad_rows)
    # Lazily, so that errors surface in file order whichever kind they are.
    rows = read_jsonl(path, on_error=lambda lineno, reason: bad.handle(RowError(f"line {lineno}: {reason}")))
    out: list[Example] = []
    seen: dict[str, int] = {}
    for lineno, row in progress(rows, "Winoground examples"):
        where = f"line {lineno}"
        try:
            wid = get_id(row, "id", where)
            if wid in seen:
                raise RowError(f"{where} repeats id {wid} (first on line {seen[wid]})")
            images = [get_str(row, f"image_{i}", where) for i in (0, 1)]
            captions = [get_str(row, f"caption_{j}", where) for j in (0, 1)]
            tag = get_str(row, "tag", where)
            seen[wid] = lineno
        except RowError as err:
            bad.handle(err)
            continue
        extra = {k: row[k] for k in ("secondary_tag", "num_main_preds", "collapsed_tag") if k in row}
        for i in (0, 1):
            for j in (0, 1):
                out.append(
                    Example(
                        id=f"{dataset}-{wid}-i{i}-c{j}",
                        dataset=dataset,
                        task="itm",
                        query=query_template.format(caption=captions[j]),
                        image=str(Path(images_dir) / f"{images[i]}{image_ext}"),
                        answers=("yes" if i == j else "no",),
                        group=tag,
                        meta={
                            "winoground_id": wid,
                            "image_index": i,
                            "caption_index": j,
                            "caption": captions[j],
                            "other_caption": captions[1 - j],
                            "image_name": images[i],
                            "tag": tag,
                            **extra,
                        },
                    )
                )
    bad.finish()
    if check_images:
        check_image_files(out)
    return out


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
    """Winoground has one split, `test`. Looks for `examples.jsonl` in `<root>` then `<root>/data`
    (the Hugging Face repository's layout) and images in the `images/` folder beside it."""
    if split != "test":
        raise ValueError(f"winoground has only the 'test' split, got {split!r}")
    root = Path(root)
    path = (
        Path(examples_file)
        if examples_file
        else first_existing([root / "examples.jsonl", root / "data" / "examples.jsonl"], EXPECTED)
    )
    return load_winoground(
        path,
        Path(images_dir) if images_dir else path.parent / "images",
        image_ext=image_ext,
        query_template=query_template,
        skip_bad_rows=skip_bad_rows,
        check_images=check_images,
    )
