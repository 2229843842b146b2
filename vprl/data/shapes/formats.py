"""Rows of the real datasets' file formats, and writing them byte-for-byte reproducibly.

GQA questions and scene graphs, Winoground's `examples.jsonl`, SugarCREPE's per-category JSON and
RefCOCO's refs (the JSON variant) with COCO `instances.json`. The layout under the output folder
is the one `vprl.data.loaders.load_dataset` expects for each dataset (see `LAYOUT`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vprl.data.shapes.grounding import Referral
from vprl.data.shapes.matching import SugarCrepeItem, WinogroundItem
from vprl.data.shapes.questions import FAMILIES, QA
from vprl.data.shapes.scene import SHAPES, Scene

# dataset -> folder under the output root, as the loaders' `*_root` functions expect it
LAYOUT = {
    "gqa": "gqa",  # <split>_balanced_questions.json, <split>_sceneGraphs.json, images/<id>.png
    "winoground": "winoground",  # data/examples.jsonl, data/images/<name>.png
    "sugarcrepe": "sugarcrepe",  # data/<category>.json, val2017/<file>
    "refcoco": "refcoco",  # refcoco/refs(unc).json, refcoco/instances.json, images/train2014/<file>
}
ITM_QUERY = 'Verify image matches text="{caption}"'  # the loaders' query form for itm items


def gqa_question_row(image_id: str, qa: QA, qid: str) -> dict[str, Any]:
    family = FAMILIES[qa.family]
    return {
        "imageId": image_id,
        "question": qa.question,
        "answer": qa.answer,
        "fullAnswer": qa.answer.capitalize() + ".",
        "types": {"structural": family.structural, "semantic": family.semantic, "detailed": qa.family},
        "groups": {"global": None, "local": f"{family.structural}-{qa.family}"},
        "annotations": {"question": {}, "answer": {}, "fullAnswer": {}},
        "semantic": [],
        "semanticStr": "",
        "isBalanced": True,
        "equivalent": [qid],
        "entailed": [],
    }


def winoground_row(item: WinogroundItem) -> dict[str, Any]:
    return {
        "id": item.id,
        "image_0": item.scenes[0].image_id,
        "image_1": item.scenes[1].image_id,
        "caption_0": item.captions[0].text,
        "caption_1": item.captions[1].text,
        "tag": item.tag,
        "secondary_tag": "",
        "num_main_preds": 1,
        "collapsed_tag": "Relation" if item.tag == "Object" else "Object",
    }


def sugarcrepe_row(item: SugarCrepeItem) -> dict[str, Any]:
    return {
        "filename": f"{item.scene.image_id}.png",
        "caption": item.positive.text,
        "negative_caption": item.negative.text,
    }


def coco_categories() -> list[dict[str, Any]]:
    return [{"id": i + 1, "name": s, "supercategory": "shape"} for i, s in enumerate(SHAPES)]


def coco_image(scene: Scene, image_num: int) -> dict[str, Any]:
    return {"id": image_num, "file_name": f"{scene.image_id}.png", "width": scene.width, "height": scene.height}


def coco_annotations(scene: Scene, image_num: int) -> list[dict[str, Any]]:
    """One COCO annotation per object; its id is `image_num * 100 + object index`."""
    return [
        {
            "id": image_num * 100 + int(o.id),
            "image_id": image_num,
            "bbox": [o.x0, o.y0, o.w, o.h],
            "area": o.area,
            "iscrowd": 0,
            "category_id": SHAPES.index(o.shape) + 1,
            "segmentation": [[]],
        }
        for o in scene.objects
    ]


def refcoco_ref(scene: Scene, image_num: int, ref_num: int, refs: list[Referral], split: str) -> dict[str, Any]:
    """One ref: an object and its sentences; `sent_id` is `ref_num * 10 + k`."""
    obj = next(o for o in scene.objects if o.id == refs[0].object_id)
    sentences = [
        {"tokens": r.sentence.split(), "raw": r.sentence, "sent_id": ref_num * 10 + k, "sent": r.sentence}
        for k, r in enumerate(refs)
    ]
    return {
        "ref_id": ref_num,
        "ann_id": image_num * 100 + int(obj.id),
        "image_id": image_num,
        "split": split,
        "category_id": SHAPES.index(obj.shape) + 1,
        "file_name": f"{scene.image_id}.png",
        "sent_ids": [s["sent_id"] for s in sentences],
        "sentences": sentences,
    }


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
