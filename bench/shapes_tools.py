"""How good and how fast are the shapes-world tools? Prints figures; asserts nothing.

    python bench/shapes_tools.py [--train 2000] [--val 300] [--seed 0] [--workers 2]

1. generation throughput of `python -m vprl.data.shapes` (questions and images per second);
2. detection precision/recall of the `shapes` backend at IoU 0.5 against the scene graphs
   (boxes alone, and boxes with the right shape and colour);
3. `vqa` accuracy of the `shapes` backend per question kind, asked about annotated objects;
4. gold-program accuracy per family, run in-process with the `shapes` and the `oracle` tools
   (exact match after lower-casing; grounding: IoU >= 0.5);
5. per-tool latency (median, p90) of the `shapes` backend over the gold-program runs.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time
from pathlib import Path

from vprl.data.boxes import iou
from vprl.data.loaders import load_dataset, load_scene_graphs
from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
from vprl.executor.api import SourceImage
from vprl.executor.program import run_in_process
from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.images import ImageStore
from vprl.executor.tools.local import LocalToolClient
from vprl.executor.tools.oracle import OracleBackend
from vprl.executor.tools.shapes import ShapesBackend

SCENE_FILES = (
    "gqa/train_sceneGraphs.json",
    "gqa/val_sceneGraphs.json",
    "winoground/sceneGraphs.json",
    "sugarcrepe/sceneGraphs.json",
    "refcoco/sceneGraphs.json",
)


def load_examples(root: Path):
    gqa = dict(image_pattern="{image_id}.png")
    return (
        load_dataset("gqa", root / "gqa", "val", **gqa)
        + load_dataset("gqa", root / "gqa", "testdev", **gqa)
        + load_dataset("winoground", root / "winoground")
        + load_dataset("sugarcrepe", root / "sugarcrepe")
        + load_dataset("refcoco", root / "refcoco", "val")
    )


def correct(example, outcome) -> bool:
    if outcome.status != "ok":
        return False
    if example.task == "grounding":
        if not isinstance(outcome.answer, dict) or "box" not in outcome.answer:
            return False
        return iou(outcome.answer["box"], example.box) >= 0.5
    return str(outcome.answer).strip().lower() == example.answers[0].lower()


def gold_accuracy(examples, gold, backend) -> tuple[dict[str, list[int]], dict[str, list[float]]]:
    """Per (dataset, group): [right, total]; per tool: call seconds."""
    client = LocalToolClient(backend)
    acc: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    seconds: dict[str, list[float]] = collections.defaultdict(list)
    for ex in examples:
        info = backend.images.add_file(ex.image)
        client.trace.clear()
        outcome, _, _ = run_in_process(
            gold[ex.task][ex.query], {"image": SourceImage(info.ref, info.width, info.height)}, client
        )
        key = f"{ex.dataset}/{ex.group}"
        acc[key][0] += correct(ex, outcome)
        acc[key][1] += 1
        for rec in client.trace:
            seconds[rec.tool].append(rec.seconds)
    return acc, seconds


def perception(root: Path) -> None:
    scenes = load_scene_graphs(root / "gqa" / "val_sceneGraphs.json")
    images = ImageStore()
    backend = ShapesBackend(images)
    counts = collections.Counter()
    vqa = collections.defaultdict(lambda: [0, 0])
    for image_id, scene in scenes.items():
        info = images.add_file(root / "gqa" / "images" / f"{image_id}.png", image_id)
        found = backend._scene_objects(info.ref)
        truth = list(scene.objects.values())
        for strict in (False, True):
            used = set()
            for o in truth:
                gt = (o.x, o.y, o.x + o.w, o.y + o.h)
                for j, d in enumerate(found):
                    same = not strict or (d.name == o.name and o.attributes[0] in d.attributes)
                    if j not in used and same and iou(gt, (d.x0, d.y0, d.x1, d.y1)) >= 0.5:
                        used.add(j)
                        break
            tag = "typed" if strict else "boxes"
            counts[f"{tag}_tp"] += len(used)
            counts[f"{tag}_pred"] += len(found)
            counts[f"{tag}_true"] += len(truth)
        for o in truth:
            box = o.box(info.height)
            for kind, question, answer in (
                ("color", "What color is this?", o.attributes[0]),
                ("shape", "What shape is this?", o.name),
                ("size", "What size is this?", o.attributes[1]),
            ):
                got = backend.vqa([ToolCall("vqa", info.ref, box, {"question": question})])[0]
                vqa[kind][0] += got == answer
                vqa[kind][1] += 1
        for shape in {o.name for o in truth}:
            n = sum(o.name == shape for o in truth)
            got = backend.vqa([ToolCall("vqa", info.ref, None, {"question": f"How many {shape}s are there?"})])[0]
            vqa["count"][0] += got == str(n)
            vqa["count"][1] += 1
    for tag in ("boxes", "typed"):
        p = counts[f"{tag}_tp"] / max(counts[f"{tag}_pred"], 1)
        r = counts[f"{tag}_tp"] / max(counts[f"{tag}_true"], 1)
        print(f"detection ({tag}, IoU>=0.5): precision {p:.3f} recall {r:.3f} over {counts[f'{tag}_true']} objects")
    for kind, (right, total) in vqa.items():
        print(f"vqa {kind:6s} accuracy {right / total:.3f} ({total} questions)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--val", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cfg = BuildConfig(out=tmp, train=args.train, val=args.val, seed=args.seed, workers=args.workers)
        t0 = time.perf_counter()
        manifest = build_dataset(cfg)
        seconds = time.perf_counter() - t0
        c = manifest["counts"]
        questions = c["gqa_train_questions"] + c["gqa_val_questions"] + c["gqa_testdev_questions"]
        print(
            f"generation: {questions} GQA questions on {c['gqa_images']} images, plus {c['winoground_examples']} "
            f"Winoground, {c['sugarcrepe_entries']} SugarCREPE and {c['refcoco_refs']} RefCOCO items, "
            f"in {seconds:.1f}s with {args.workers} workers ({questions / seconds:.0f} questions/s)"
        )

        examples = load_examples(root)
        perception(root)

        gold = load_gold_programs(root)
        scenes = {}
        for name in SCENE_FILES:
            scenes.update(load_scene_graphs(root / name))
        results = {}
        for label, backend in (
            ("shapes", ShapesBackend(ImageStore())),
            ("oracle", OracleBackend(ImageStore(), scenes=scenes)),
        ):
            results[label] = gold_accuracy(examples, gold, backend)
        print(
            f"\ngold-program accuracy ({len(examples)} examples)\n{'family':40s} {'n':>5s} {'shapes':>7s} {'oracle':>7s}"
        )
        for key in sorted(results["oracle"][0]):
            n = results["oracle"][0][key][1]
            s, o = (results[b][0][key][0] / n for b in ("shapes", "oracle"))
            print(f"{key:40s} {n:5d} {s:7.3f} {o:7.3f}")
        print("\nshapes tool latency (ms), first call per image includes segmentation")
        for tool, secs in sorted(results["shapes"][1].items()):
            ms = sorted(1000 * s for s in secs)
            p90 = ms[int(0.9 * (len(ms) - 1))]
            print(f"{tool:8s} calls {len(ms):6d} median {statistics.median(ms):6.3f} p90 {p90:6.3f}")


if __name__ == "__main__":
    main()
