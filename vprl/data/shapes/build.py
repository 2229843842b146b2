"""Writing a whole shapes-world dataset: images, the four datasets' files, gold programs, manifest.

Work is split into jobs (one GQA image with its questions, one Winoground pair, ...). Each job
draws from its own random generator seeded by `(seed, task, split, index)` and writes its own PNGs,
so the output does not depend on the number of workers or on scheduling: the same seed gives
byte-identical files.
"""

from __future__ import annotations

import json
import math
import multiprocessing
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from vprl.data.shapes import formats
from vprl.data.shapes.grounding import referrals
from vprl.data.shapes.matching import SUGARCREPE_CATEGORIES, caption_program, sugarcrepe_item, winoground_item
from vprl.data.shapes.questions import HELDOUT_FAMILIES, TRAIN_FAMILIES, sample_questions
from vprl.data.shapes.render import png_bytes, render
from vprl.data.shapes.scene import Scene, generate_scene, scene_to_gqa

TASK_CODES = {"gqa": 1, "winoground": 2, "sugarcrepe": 3, "refcoco": 4}
SPLIT_CODES = {"train": 1, "val": 2}
MAX_TRIES = 20  # re-draws of a job whose random draw admits no valid item


@dataclass(frozen=True)
class BuildConfig:
    out: str
    train: int = 1000  # GQA-format questions from the training families, on training images
    val: int = 200  # questions from the training families on validation images (and as many held-out)
    seed: int = 0
    winoground: int = 50  # Winoground examples (each two images, two captions)
    sugarcrepe: int = 30  # SugarCREPE entries per category
    refcoco: int = 100  # RefCOCO images (up to 3 refs each)
    questions_per_image: int = 5
    width: int = 256
    height: int = 256
    workers: int = 2

    def __post_init__(self) -> None:
        if not self.out:
            raise ValueError("out: the folder to write the world to is required")
        for name in ("train", "val", "winoground", "sugarcrepe", "refcoco"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        for name in ("questions_per_image", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if min(self.width, self.height) < 64:
            raise ValueError(f"width, height: images need at least 64 pixels a side, got {self.width}x{self.height}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _rng(cfg: BuildConfig, task: str, split: str, index: int, attempt: int = 0) -> np.random.Generator:
    return np.random.default_rng([cfg.seed, TASK_CODES[task], SPLIT_CODES.get(split, 0), index, attempt])


def _save(scene: Scene, rng: np.random.Generator, folder: Path) -> None:
    (folder / f"{scene.image_id}.png").write_bytes(png_bytes(render(scene, rng)))


# -- jobs (run in worker processes; arguments and results are plain data) ---------------------------
def gqa_job(args: tuple[BuildConfig, str, int]) -> dict[str, Any]:
    cfg, split, index = args
    rng = _rng(cfg, "gqa", split, index)
    scene = generate_scene(rng, f"{split}_{index:06d}", cfg.width, cfg.height)
    n = cfg.questions_per_image
    main = sample_questions(scene, rng, TRAIN_FAMILIES, n)
    heldout = sample_questions(scene, rng, HELDOUT_FAMILIES, n) if split == "val" else []
    _save(scene, rng, Path(cfg.out) / "gqa" / "images")
    return {"image_id": scene.image_id, "scene": scene_to_gqa(scene), "main": main, "heldout": heldout}


def winoground_job(args: tuple[BuildConfig, int]) -> dict[str, Any]:
    cfg, index = args
    for attempt in range(MAX_TRIES):
        rng = _rng(cfg, "winoground", "", index, attempt)
        item = winoground_item(rng, index, (cfg.width, cfg.height))
        if item is not None:
            for scene in item.scenes:
                _save(scene, rng, Path(cfg.out) / "winoground" / "data" / "images")
            return {
                "row": formats.winoground_row(item),
                "scenes": {s.image_id: scene_to_gqa(s) for s in item.scenes},
                "programs": {c.text: caption_program(c) for c in item.captions},
            }
    raise RuntimeError(f"winoground item {index}: no valid pair after {MAX_TRIES} draws")


def sugarcrepe_job(args: tuple[BuildConfig, str, int]) -> dict[str, Any]:
    cfg, category, index = args
    for attempt in range(MAX_TRIES * 5):
        rng = _rng(cfg, "sugarcrepe", "", SUGARCREPE_CATEGORIES.index(category) * 1_000_000 + index, attempt)
        item = sugarcrepe_item(rng, category, index, (cfg.width, cfg.height))
        if item is not None:
            _save(item.scene, rng, Path(cfg.out) / "sugarcrepe" / "val2017")
            return {
                "row": formats.sugarcrepe_row(item),
                "scenes": {item.scene.image_id: scene_to_gqa(item.scene)},
                "programs": {c.text: caption_program(c) for c in (item.positive, item.negative)},
            }
    raise RuntimeError(f"sugarcrepe {category} item {index}: no valid entry after {MAX_TRIES * 5} draws")


def refcoco_job(args: tuple[BuildConfig, int, str]) -> dict[str, Any]:
    cfg, index, split = args
    rng = _rng(cfg, "refcoco", split, index)
    scene = generate_scene(rng, f"refcoco_{index:06d}", cfg.width, cfg.height, min_objects=2)
    image_num = index + 1
    found = referrals(scene, rng)
    refs = [formats.refcoco_ref(scene, image_num, image_num * 10 + k, rs, split) for k, (_, rs) in enumerate(found)]
    _save(scene, rng, Path(cfg.out) / "refcoco" / "images" / "train2014")
    return {
        "image": formats.coco_image(scene, image_num),
        "annotations": formats.coco_annotations(scene, image_num),
        "refs": refs,
        "scenes": {scene.image_id: scene_to_gqa(scene)},
        "programs": {r.sentence: r.program for _, rs in found for r in rs},
    }


def _map(fn: Callable, jobs: list, workers: int, desc: str) -> Iterable:
    if workers <= 1 or len(jobs) < 16:
        yield from tqdm(map(fn, jobs), total=len(jobs), desc=desc, leave=False)
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers) as pool:
        yield from tqdm(pool.imap(fn, jobs, chunksize=8), total=len(jobs), desc=desc, leave=False)


def _gqa_split(cfg: BuildConfig, split: str, wanted: int, gold: dict[str, str]) -> dict[str, Any]:
    """Generate images until `wanted` questions exist; returns the files' contents and counts."""
    questions: dict[str, dict] = {}
    heldout: dict[str, dict] = {}
    scenes: dict[str, dict] = {}
    index = 0
    while len(questions) < wanted:
        batch = math.ceil((wanted - len(questions)) / cfg.questions_per_image * 1.1) + 1
        jobs = [(cfg, split, i) for i in range(index, index + batch)]
        index += batch
        for res in _map(gqa_job, jobs, cfg.workers, f"shapes gqa {split}"):
            scenes[res["image_id"]] = res["scene"]
            for kind, target in (("main", questions), ("heldout", heldout)):
                for k, qa in enumerate(res[kind]):
                    if len(target) < wanted:
                        qid = f"{split}{'h' if kind == 'heldout' else ''}{res['image_id'][len(split) + 1 :]}{k}"
                        target[qid] = formats.gqa_question_row(res["image_id"], qa, qid)
                        gold[qa.question] = qa.program
    return {"questions": questions, "heldout": heldout, "scenes": scenes}


def build_dataset(cfg: BuildConfig) -> dict[str, Any]:
    """Write the dataset under `cfg.out`; returns the manifest (also written as manifest.json)."""
    out = Path(cfg.out)
    for folder in ("gqa/images", "winoground/data/images", "sugarcrepe/val2017", "refcoco/images/train2014"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    gold: dict[str, dict[str, str]] = {"vqa": {}, "itm": {}, "grounding": {}}
    counts: dict[str, int] = {}

    gqa = out / "gqa"
    train = _gqa_split(cfg, "train", cfg.train, gold["vqa"])
    val = _gqa_split(cfg, "val", cfg.val, gold["vqa"])
    formats.write_json(gqa / "train_balanced_questions.json", train["questions"])
    formats.write_json(gqa / "val_balanced_questions.json", val["questions"])
    formats.write_json(gqa / "testdev_balanced_questions.json", val["heldout"])
    formats.write_json(gqa / "train_sceneGraphs.json", train["scenes"])
    formats.write_json(gqa / "val_sceneGraphs.json", val["scenes"])
    counts.update(
        gqa_train_questions=len(train["questions"]),
        gqa_val_questions=len(val["questions"]),
        gqa_testdev_questions=len(val["heldout"]),
        gqa_images=len(train["scenes"]) + len(val["scenes"]),
    )

    rows, scenes = [], {}
    for res in _map(winoground_job, [(cfg, i) for i in range(cfg.winoground)], cfg.workers, "shapes winoground"):
        rows.append(res["row"])
        scenes.update(res["scenes"])
        gold["itm"].update({formats.ITM_QUERY.format(caption=c): p for c, p in res["programs"].items()})
    formats.write_jsonl(out / "winoground" / "data" / "examples.jsonl", rows)
    formats.write_json(out / "winoground" / "sceneGraphs.json", scenes)
    counts["winoground_examples"] = len(rows)

    scenes = {}
    jobs = [(cfg, cat, i) for cat in SUGARCREPE_CATEGORIES for i in range(cfg.sugarcrepe)]
    per_cat: dict[str, dict[str, dict]] = {cat: {} for cat in SUGARCREPE_CATEGORIES}
    for (_, cat, i), res in zip(jobs, _map(sugarcrepe_job, jobs, cfg.workers, "shapes sugarcrepe")):
        per_cat[cat][str(i)] = res["row"]
        scenes.update(res["scenes"])
        gold["itm"].update({formats.ITM_QUERY.format(caption=c): p for c, p in res["programs"].items()})
    for cat, entries in per_cat.items():
        formats.write_json(out / "sugarcrepe" / "data" / f"{cat}.json", entries)
    formats.write_json(out / "sugarcrepe" / "sceneGraphs.json", scenes)
    counts["sugarcrepe_entries"] = sum(len(v) for v in per_cat.values())

    n_train = int(round(cfg.refcoco * 0.8))
    jobs = [(cfg, i, "train" if i < n_train else "val") for i in range(cfg.refcoco)]
    images, anns, refs, scenes = [], [], [], {}
    for res in _map(refcoco_job, jobs, cfg.workers, "shapes refcoco"):
        images.append(res["image"])
        anns.extend(res["annotations"])
        refs.extend(res["refs"])
        scenes.update(res["scenes"])
        gold["grounding"].update(res["programs"])
    instances = {"info": {}, "licenses": [], "images": images, "annotations": anns}
    instances["categories"] = formats.coco_categories()
    formats.write_json(out / "refcoco" / "refcoco" / "refs(unc).json", refs)
    formats.write_json(out / "refcoco" / "refcoco" / "instances.json", instances)
    formats.write_json(out / "refcoco" / "sceneGraphs.json", scenes)
    counts.update(refcoco_refs=len(refs), refcoco_sentences=sum(len(r["sentences"]) for r in refs))

    formats.write_json(out / "gold_programs.json", gold)
    manifest = {
        "config": {k: v for k, v in cfg.to_json().items() if k not in ("out", "workers")},
        "counts": counts,
        "vqa_families": {"train": list(TRAIN_FAMILIES), "heldout": list(HELDOUT_FAMILIES)},
        "splits": {
            "gqa/train_balanced_questions.json": "training families, training images",
            "gqa/val_balanced_questions.json": "training families, validation images",
            "gqa/testdev_balanced_questions.json": "held-out families, validation images",
        },
        "scene_graphs": [
            "gqa/train_sceneGraphs.json",
            "gqa/val_sceneGraphs.json",
            "winoground/sceneGraphs.json",
            "sugarcrepe/sceneGraphs.json",
            "refcoco/sceneGraphs.json",
        ],
        "gold_programs": "gold_programs.json: {task: {Example.query: program}}",
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    (out / "README.md").write_text(readme(manifest), encoding="utf-8")
    return manifest


def readme(manifest: dict[str, Any]) -> str:
    lines = [
        "# Shapes world dataset",
        "",
        "Generated by `python -m vprl.data.shapes`; read it with `vprl.data.loaders.load_dataset(name, root)`:",
        "`gqa` (root `gqa/`, image_pattern `{image_id}.png`), `winoground` (root `winoground/`),",
        "`sugarcrepe` (root `sugarcrepe/`, image_ext is part of `filename`), `refcoco` (root `refcoco/`).",
        "The GQA question's `types.detailed` is its family; gold programs are in `gold_programs.json`,",
        "keyed by task and by the Example query. Scene graphs (GQA format) exist for every image.",
        "",
        "## Splits",
        *[f"- `{k}`: {v}" for k, v in manifest["splits"].items()],
        "",
        "## VQA families",
        f"- training: {', '.join(manifest['vqa_families']['train'])}",
        f"- held out: {', '.join(manifest['vqa_families']['heldout'])}",
        "",
        "## Counts",
        *[f"- {k}: {v}" for k, v in manifest["counts"].items()],
        "",
    ]
    return "\n".join(lines)
