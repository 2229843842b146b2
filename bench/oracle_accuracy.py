"""How often does the `oracle` backend give the answer a person would? Prints figures; asserts nothing.

    python bench/oracle_accuracy.py [--world DIR] [--seed 0] [--json OUT.json]

1. the shapes world's gold GQA programs (train, val and held-out questions of a world from
   `python -m vprl.data.shapes`; built into a temporary folder with the default sizes unless `--world`
   names one): exact match of the answer after lower-casing;
2. the GQA-style programs of `tests/fixtures/oracle_gqa_programs.jsonl` on the hand-made scene
   graphs of `tests/fixtures/oracle_gqa_scenes.json`, written in the style of the ViperGPT,
   Stanić et al. and ViUniT prompts, each with the answer a person gives looking at the scene;
   per kind of question, per batch (`written`: "before" the oracle's issue-#19 rewrite, to show
   its faults, or "after" it, as a check that the rewrite was not fitted to the first batch), and
   every miss with what the oracle answered.

Programs run in-process (`vprl.executor.program.run_in_process`, no sandbox) against the oracle built
from the scene graphs, as `python -m vprl.executor.run --sandbox none --tools oracle`
would run them; a program the oracle makes fail counts as wrong.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
from vprl.data.shapes.tasks import load_shapes_tasks
from vprl.executor.api import SourceImage
from vprl.executor.backends import open_backend
from vprl.executor.program import run_in_process
from vprl.executor.tools.images import ImageStore
from vprl.executor.tools.local import LocalToolClient

REPO = Path(__file__).resolve().parents[1]
CONFIG = "oracle"  # the named stack
FIXTURES = REPO / "tests" / "fixtures"
PROGRAMS = FIXTURES / "oracle_gqa_programs.jsonl"
SCENES = FIXTURES / "oracle_gqa_scenes.json"


def _norm(answer) -> str:
    return str(answer).strip().lower()


def shapes_accuracy(world: Path) -> dict[str, list[int]]:
    """Per task (train, val, heldout): [right, total] of the gold programs on the oracle."""
    gold = load_gold_programs(world)["vqa"]
    backend = open_backend(CONFIG, worlds=[world])
    client = LocalToolClient(backend)
    acc: dict[str, list[int]] = {}
    for task, examples in load_shapes_tasks(world, ["train", "val", "heldout"]).items():
        right = 0
        for ex in examples:
            info = backend.images.add_file(ex.image)
            image = SourceImage(info.ref, info.width, info.height)
            client.trace.clear()  # the client caps calls over its trace: one program's calls at a time
            outcome, _, _ = run_in_process(gold[ex.query], {"image": image}, client)
            right += outcome.status == "ok" and _norm(outcome.answer) in {_norm(a) for a in ex.answers}
        acc[task] = [right, len(examples)]
    return acc


def _scene_image(folder: Path, scene_id: str, scene: dict) -> Path:
    # The store keys images by content, so blank images of one size would be one image: each gets
    # a few pixels from its scene id. The file's stem is the id the oracle looks the scene up by.
    pixels = np.zeros((scene["height"], scene["width"], 3), dtype=np.uint8)
    digest = np.frombuffer(hashlib.sha1(scene_id.encode()).digest(), dtype=np.uint8)
    pixels[0, :6] = digest[:18].reshape(6, 3)
    path = folder / f"{scene_id}.png"
    Image.fromarray(pixels).save(path)
    return path


def fixture_results(programs: Path = PROGRAMS, scenes: Path = SCENES) -> list[dict]:
    """One row per fixture program: id, kind, expected, answer (or the error), right."""
    graphs = json.loads(scenes.read_text())
    records = [json.loads(line) for line in programs.read_text().splitlines() if line.strip()]
    store = ImageStore()
    backend = open_backend(CONFIG, store, scene_graphs=str(scenes))
    client = LocalToolClient(backend)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sources = {}
        for scene_id, scene in graphs.items():
            info = store.add_file(_scene_image(Path(tmp), scene_id, scene))
            sources[scene_id] = SourceImage(info.ref, info.width, info.height)
        for rec in records:
            client.trace.clear()
            outcome, _, _ = run_in_process(rec["program"], {"image": sources[rec["scene"]]}, client)
            answer = outcome.answer if outcome.status == "ok" else f"{outcome.status}: {outcome.error}"
            right = outcome.status == "ok" and _norm(outcome.answer) == _norm(rec["answer"])
            rows.append(
                {
                    "id": rec["id"],
                    "kind": rec["kind"],
                    "written": rec["written"],
                    "expected": rec["answer"],
                    "answer": answer,
                    "right": right,
                }
            )
    return rows


def _pct(right: int, total: int) -> str:
    return f"{right}/{total} = {100 * right / max(total, 1):.1f}%"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=Path, default=None, help="a shapes world folder (default: build one)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the world built when --world is not given")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        world = args.world
        if world is None:
            world = Path(tmp) / "shapes"
            build_dataset(BuildConfig(out=str(world), seed=args.seed))
        shapes = shapes_accuracy(world)
    right, total = (sum(v[i] for v in shapes.values()) for i in (0, 1))
    print(f"(a) shapes-world gold GQA programs on the oracle: {_pct(right, total)}")
    for task, (r, n) in shapes.items():
        print(f"    {task:8s} {_pct(r, n)}")

    rows = fixture_results()
    groups: dict[str, dict[str, list[int]]] = {"kind": {}, "written": {}}
    for row in rows:
        for field, tally in groups.items():
            counts = tally.setdefault(row[field], [0, 0])
            counts[0] += row["right"]
            counts[1] += 1
    print(f"(b) GQA-style programs ({PROGRAMS.name}) on the oracle: {_pct(sum(r['right'] for r in rows), len(rows))}")
    for field, tally in groups.items():
        for key, (r, n) in sorted(tally.items()):
            print(f"    {field} {key:20s} {_pct(r, n)}")
    for row in rows:
        if not row["right"]:
            print(f"    miss {row['id']}: expected {row['expected']!r}, got {str(row['answer'])[:100]!r}")
    figures = {"shapes": shapes, "fixture": groups, "fixture_rows": rows}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=str))
    return figures


if __name__ == "__main__":
    main()
