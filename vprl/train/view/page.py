"""Write the page: `index.html` (the viewer's CSS and JavaScript inlined), `data.js` (the cards, as
one JavaScript assignment: a page opened from disk may load a script beside it, but not fetch a
JSON file) and `images/` (the pictures). Nothing is fetched from anywhere when it opens.
"""

from __future__ import annotations

import html
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vprl.train.rollouts.log import ROLLOUTS_FILE
from vprl.train.view.eval_data import PREDICTIONS_FILE, read_evaluation
from vprl.train.view.images import Pictures
from vprl.train.view.out_folder import OutFolder
from vprl.train.view.run_data import read_run

ASSETS = Path(__file__).resolve().parent / "assets"
PAGE_FILE = "index.html"
DATA_FILE = "data.js"


@dataclass(frozen=True)
class ViewOptions:
    out: Path | None = None  # default: <folder>/view
    limit: int = 400  # groups (a run) or questions (an evaluation) on the page
    seed: int = 0
    steps: tuple[int, int] | None = None
    thumb: int = 384
    dataset_root: str | None = None
    use_examples: bool = True
    before: str | None = None
    after: str | None = None


def folder_kind(folder: Path) -> str:
    if (folder / ROLLOUTS_FILE).is_file():
        return "run"
    if (folder / PREDICTIONS_FILE).is_file():
        return "evaluation"
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder")
    raise ValueError(f"{folder}: neither a run folder ({ROLLOUTS_FILE}) nor an evaluation folder ({PREDICTIONS_FILE})")


def build_view(folder: str | Path, options: ViewOptions | None = None) -> dict[str, Any]:
    """Write the page for a run or evaluation folder; returns where it went and what it holds."""
    options = options or ViewOptions()
    started = time.perf_counter()
    folder = Path(folder)
    kind = folder_kind(folder)
    out = OutFolder.open(options.out or folder / "view")
    try:
        pictures = Pictures(out, base=folder, max_side=options.thumb)
        try:
            data = (_run_data if kind == "run" else _eval_data)(folder, pictures, options)
            data["images"] = [p.to_json() for p in pictures.table]
            data["notes"] += image_notes(pictures)
            out.write(DATA_FILE, ("window.VIEW_DATA = " + js_json(data) + ";\n").encode("utf-8"))
            out.write(PAGE_FILE, page_html(data["title"]).encode("utf-8"))
            size = out.size(DATA_FILE) + out.size(PAGE_FILE) + pictures.written_bytes()
        finally:
            pictures.close()
    finally:
        out.close()
    seconds = time.perf_counter() - started
    return {
        "page": out.path / PAGE_FILE,
        "kind": kind,
        "cards": len(data["cards"]),
        "images": len(data["images"]),
        "bytes": size,
        "seconds": seconds,
        "shown": data["shown"],
    }


def image_notes(pictures: Pictures) -> list[str]:
    notes = []
    if pictures.missing:
        notes.append(f"{len(pictures.missing)} image(s) could not be read, e.g. {Path(pictures.missing[0]).name}")
    if pictures.refused:
        notes.append(
            f"{len(pictures.refused)} image path(s) refused (only regular files under the folder or its dataset "
            f"roots are read), e.g. {next(iter(pictures.refused.values()))}"
        )
    return notes


# A lone surrogate (a JSON file's "\ud800", a file name undecodable as UTF-8) cannot be written as
# UTF-8: in data.js it is written as the escape JavaScript reads back, in the page as U+FFFD.
_SURROGATE = re.compile("[\ud800-\udfff]")


def js_json(value: object) -> str:
    """`value` as a JavaScript literal any string of the rows can be in: JSON escapes quotes and
    backslashes; data.js is a script file of its own, so no `</script>` in it ends anything."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def page_html(title: str) -> str:
    """The template's slots filled in one pass, so that a title holding `__JS__` stays text."""
    template = (ASSETS / "page.html").read_text(encoding="utf-8")
    slots = {
        "__TITLE__": html.escape(_SURROGATE.sub("\ufffd", title)),
        "__CSS__": (ASSETS / "view.css").read_text(encoding="utf-8"),
        "__JS__": (ASSETS / "view.js").read_text(encoding="utf-8"),
    }
    if re.search(r"</(script|style)", slots["__JS__"] + slots["__CSS__"], re.IGNORECASE):
        raise AssertionError(f"{ASSETS}: view.js or view.css holds a closing tag that would end its inline element")
    return re.sub("__(?:TITLE|CSS|JS)__", lambda m: slots[m.group()], template)


def _run_data(folder: Path, pictures: Pictures, options: ViewOptions) -> dict[str, Any]:
    run = read_run(
        folder, pictures, options.limit, options.seed, options.steps, options.dataset_root, options.use_examples
    )
    shown_groups = len(run.groups)
    scope = "" if options.steps is None else f" of steps {options.steps[0]} to {options.steps[1]}"
    if shown_groups < run.eligible_groups:
        how = f"drawn evenly across steps{scope} (seed {options.seed}; --limit shows more)"
    else:
        how = "every group" + scope
    shown = (
        f"Showing {len(run.cards):,} of {run.total_rows:,} rollouts: {shown_groups:,} of {run.total_groups:,} groups, "
        f"{how}. The curves use every rollout."
    )
    return {
        "kind": "run",
        "title": f"{folder.resolve().name}: programs of the run",
        "shown": shown,
        "notes": run.notes,
        "cards": run.cards,
        "groups": run.groups,
        "curves": run.curves,
        "components": run.components,
    }


def _eval_data(folder: Path, pictures: Pictures, options: ViewOptions) -> dict[str, Any]:
    ev = read_evaluation(
        folder,
        pictures,
        options.limit,
        options.seed,
        options.before,
        options.after,
        options.dataset_root,
        options.use_examples,
    )
    counts = ", ".join(
        f"{ev.kinds.get(k, 0):,} {k.replace('_', ' ')}" for k in ("fixed", "broken", "both_right", "both_wrong")
    )
    if len(ev.pairs) < ev.total_pairs:
        how = f"first every changed verdict, then unchanged ones at random (seed {options.seed}; --limit shows more)"
    else:
        how = "every question"
    shown = (
        f"{ev.policies[0]} (before) against {ev.policies[1]} (after): showing {len(ev.pairs):,} of {ev.total_pairs:,} "
        f"questions, {how}. Over all questions: {counts}."
    )
    return {
        "kind": "evaluation",
        "title": f"{folder.resolve().name}: {ev.policies[0]} against {ev.policies[1]}",
        "shown": shown,
        "notes": ev.notes,
        "cards": ev.cards,
        "pairs": ev.pairs,
        "policies": list(ev.policies),
        "curves": None,
        "components": sorted({k for c in ev.cards for k in c["comp"]}),
    }
