"""SugarCREPE in its official format: one JSON file per hard-negative category.

Files (the SugarCREPE repository's `data/` folder): `replace_att.json`, `replace_obj.json`,
`replace_rel.json`, `swap_att.json`, `swap_obj.json`, `add_att.json`, `add_obj.json`; each is
`{"<idx>": {"filename": "<COCO val2017 file>", "caption": "<positive>",
"negative_caption": "<hard negative>"}}`. Images are COCO val2017 (`000000xxxxxx.jpg`).

Each entry gives two `itm` items on the same image: the positive caption (answer "yes") and the
hard negative (answer "no"). `group` is the category. Queries use ViUniT's ITM form
`Verify image matches text="<caption>"` (ViUniT shows SugarCREPE as yes/no questions but does not
say how they were made; `query_template` changes the form). `meta["entry"]` ("<category>/<idx>")
ties the pair together so split recipes never separate a positive from its negative.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vprl.data.loaders._common import ITM_QUERY, check_image_files, first_existing, load_json, parse_rows
from vprl.data.loaders.rows import get_str
from vprl.data.records import Example

CATEGORIES = ("replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj", "add_att", "add_obj")


def _expected(category: str) -> str:
    return f"SugarCREPE's {category}.json (one of {', '.join(c + '.json' for c in CATEGORIES)})"


def load_sugarcrepe_file(
    path: str | Path,
    images_dir: str | Path,
    *,
    category: str | None = None,
    dataset: str = "sugarcrepe",
    query_template: str = ITM_QUERY,
    skip_bad_rows: bool = False,
) -> list[Example]:
    """One category file as `itm` Examples, positive then negative for each entry (file order).
    The category defaults to the file's stem."""
    path = Path(path)
    category = category or path.stem
    data = load_json(path, _expected(category))

    def parse(item: tuple[str, Any]) -> list[Example]:
        idx, row = item
        where = f"entry '{idx}'"
        filename = get_str(row, "filename", where)
        captions = {"pos": get_str(row, "caption", where), "neg": get_str(row, "negative_caption", where)}
        return [
            Example(
                id=f"{dataset}-{category}-{idx}-{polarity}",
                dataset=dataset,
                task="itm",
                query=query_template.format(caption=caption),
                image=str(Path(images_dir) / filename),
                answers=("yes" if polarity == "pos" else "no",),
                group=category,
                meta={
                    "entry": f"{category}/{idx}",
                    "category": category,
                    "index": str(idx),
                    "polarity": polarity,
                    "caption": caption,
                    "other_caption": captions["neg" if polarity == "pos" else "pos"],
                    "filename": filename,
                },
            )
            for polarity, caption in captions.items()
        ]

    per_entry = parse_rows(data.items(), parse, path, skip_bad_rows, f"SugarCREPE {category}", len(data))
    return [example for examples in per_entry for example in examples]


def load_sugarcrepe(
    data_dir: str | Path,
    images_dir: str | Path,
    *,
    categories: Sequence[str] = CATEGORIES,
    dataset: str = "sugarcrepe",
    query_template: str = ITM_QUERY,
    skip_bad_rows: bool = False,
    check_images: bool = False,
) -> list[Example]:
    """Every requested category file in `data_dir`, in `categories` order. A missing file is an
    error (pass `categories=` to load a subset on purpose)."""
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown:
        raise ValueError(f"unknown SugarCREPE categories {unknown}; valid: {list(CATEGORIES)}")
    out: list[Example] = []
    for cat in categories:
        path = first_existing([Path(data_dir) / f"{cat}.json"], _expected(cat))
        out.extend(
            load_sugarcrepe_file(
                path,
                images_dir,
                category=cat,
                dataset=dataset,
                query_template=query_template,
                skip_bad_rows=skip_bad_rows,
            )
        )
    if check_images:
        check_image_files(out)
    return out


def load_sugarcrepe_root(
    root: str | Path,
    split: str = "test",
    *,
    data_dir: str | Path | None = None,
    images_dir: str | Path | None = None,
    categories: Sequence[str] = CATEGORIES,
    query_template: str = ITM_QUERY,
    skip_bad_rows: bool = False,
    check_images: bool = False,
) -> list[Example]:
    """SugarCREPE ships one set (`test`); training subsets come from `sampling.sugarcrepe_splits`.
    Category files are looked for in `<root>/data` (the repository layout) or `<root>`, images in
    `<root>/val2017`."""
    if split != "test":
        raise ValueError(
            f"sugarcrepe has only the 'test' split (use vprl.data.loaders.sampling for train), got {split!r}"
        )
    root = Path(root)
    if data_dir is None:
        data_dir = root / "data" if (root / "data" / f"{categories[0]}.json").is_file() else root
    return load_sugarcrepe(
        data_dir,
        Path(images_dir) if images_dir else root / "val2017",
        categories=categories,
        query_template=query_template,
        skip_bad_rows=skip_bad_rows,
        check_images=check_images,
    )
