"""The GQA recipes' in-context examples: GQA questions (not the shapes world's), each program run
against the oracle tools on a scene written for its question, giving the answer a person gives; the
programs call only what the ViUniT prompt lists; and every GQA recipe and evaluation config uses them."""

from __future__ import annotations

import ast
import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from vprl.executor.api import SourceImage
from vprl.executor.api.spec import get_variant
from vprl.executor.program import run_in_process
from vprl.executor.tools.images import ImageStore
from vprl.executor.tools.local import LocalToolClient
from vprl.executor.tools.oracle import OracleBackend
from vprl.train.prompts import read_examples

REPO = Path(__file__).resolve().parents[1]
GQA_ICES = "configs/prompts/gqa_ices.jsonl"
ICES = {ex.query: ex for ex in read_examples(REPO / GQA_ICES)}


def _obj(name, x, y, w, h, attributes=(), relations=()):
    return {"name": name, "x": x, "y": y, "w": w, "h": h, "attributes": list(attributes), "relations": list(relations)}


# Per question: a scene (GQA scene-graph format, top-left pixels, 640 x 480) and a person's answer.
# Each scene holds a distractor the program must not pick, so a program that ignores the relation
# the question asks about gives another answer.
SCENES = {
    "Is the shirt blue?": (
        {
            "man": _obj("man", 200, 60, 160, 400, ["standing"]),
            "shirt": _obj("shirt", 215, 140, 130, 150, ["light blue"]),
        },
        "yes",
    ),
    "What color is the car to the left of the tree?": (
        {
            "tree": _obj("tree", 300, 40, 80, 300, ["green"]),
            "car1": _obj("car", 40, 260, 200, 110, ["red"]),
            "car2": _obj("car", 420, 250, 200, 120, ["white"]),
        },
        "red",
    ),
    "Is there a cup on the table?": (
        {
            "table": _obj("table", 100, 250, 420, 200, ["wooden"]),
            "cup": _obj("cup", 200, 270, 40, 50, ["white"], [{"name": "on", "object": "table"}]),
            "plate": _obj("plate", 300, 290, 120, 30, ["white"]),
        },
        "yes",
    ),
    "Are there both cups and plates in the picture?": (
        {"table": _obj("table", 100, 250, 420, 200), "cup": _obj("cup", 200, 270, 40, 50, ["white"])},
        "no",
    ),
    "Is the bag to the left or to the right of the woman?": (
        {
            "woman": _obj("woman", 250, 80, 120, 380, ["walking"]),
            "bag": _obj("bag", 400, 260, 70, 80, ["black"]),
        },
        "right",
    ),
    "Which animal is standing on the grass?": (
        {
            "grass": _obj("grass", 0, 300, 640, 180, ["green"]),
            "bird": _obj("bird", 40, 30, 60, 40, ["flying"]),
            "horse": _obj("horse", 220, 160, 220, 250, ["brown", "standing"]),
            "sky": _obj("sky", 0, 0, 640, 150, ["blue"]),
        },
        "horse",
    ),
    "Are the chair and the table made of the same material?": (
        {
            "chair": _obj("chair", 60, 200, 140, 240, ["metal"]),
            "table": _obj("table", 260, 250, 320, 200, ["wooden", "brown"]),
        },
        "no",
    ),
    "Who is wearing a helmet?": (
        {
            "woman": _obj("woman", 60, 100, 120, 360, ["standing"]),
            "man": _obj("man", 380, 80, 130, 380, ["riding"], [{"name": "wearing", "object": "helmet"}]),
            "helmet": _obj("helmet", 405, 82, 80, 60, ["black"]),
            "bike": _obj("bike", 340, 260, 220, 200, ["red"]),
        },
        "man",
    ),
}
# Words of the shapes world's questions: a GQA prompt that shows them teaches the wrong vocabulary.
SHAPES_WORDS = re.compile(r"\b(circles?|squares?|triangles?|stars?|shapes?)\b", re.I)


def _run(query: str, tmp_path: Path):
    objects, answer = SCENES[query]
    scene_id = hashlib.sha1(query.encode()).hexdigest()[:10]
    scene = {"width": 640, "height": 480, "objects": objects}
    pixels = np.zeros((480, 640, 3), dtype=np.uint8)
    pixels[0, :20] = np.frombuffer(hashlib.sha1(query.encode()).digest(), dtype=np.uint8)[:20, None]
    png = tmp_path / f"{scene_id}.png"
    Image.fromarray(pixels).save(png)
    store = ImageStore()
    info = store.add_file(png)
    client = LocalToolClient(OracleBackend(store, scenes={info.image_id: scene}))
    outcome, _, _ = run_in_process(ICES[query].program, {"image": SourceImage(info.ref, 640, 480)}, client)
    return outcome, answer


def test_every_gqa_ice_has_a_scene_and_is_a_gqa_question():
    assert set(ICES) == set(SCENES)
    assert all(not SHAPES_WORDS.search(q + ICES[q].program) for q in ICES)
    assert all(ex.extra.get("source") == "hand-written" for ex in ICES.values())


@pytest.mark.parametrize("query", sorted(SCENES))
def test_gqa_ice_gives_a_persons_answer_on_the_oracle(query, tmp_path):
    outcome, answer = _run(query, tmp_path)
    assert outcome.status == "ok", outcome.error
    assert str(outcome.answer).strip().lower() == answer


@pytest.mark.parametrize("query", sorted(SCENES))
def test_gqa_ice_calls_only_what_the_viunit_prompt_lists(query):
    variant = get_variant("viunit")
    listed = {member for _, members in variant.classes for member in members} | set(variant.functions)
    attributes = {"left", "right", "lower", "upper", "width", "height", "horizontal_center", "vertical_center"}
    tree = ast.parse(ICES[query].program)
    called = {
        node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)
    }
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert called - {"ImagePatch", "len", "str"} <= listed
    assert used - called <= attributes


def _ice_settings() -> list[tuple[str, str, str | None]]:
    out = []
    for path in sorted([*REPO.glob("configs/*gqa*.yaml"), *REPO.glob("configs/eval/gqa_*.yaml")]):
        data = yaml.safe_load(path.read_text())
        if "dataset_mixture" in data:  # each GQA entry names its own
            for i, entry in enumerate(data["dataset_mixture"]["datasets"]):
                if entry["dataset"] == "gqa":
                    key = f"dataset_mixture.datasets[{i}].prompt.ice_file"
                    out.append((str(path.relative_to(REPO)), key, entry.get("prompt", {}).get("ice_file")))
            continue
        key = "prompt_ice_file"  # the recipe's and the evaluation's name alike (docs/configs.md)
        out.append((str(path.relative_to(REPO)), key, data.get(key)))
    return out


def test_gqa_recipes_do_not_point_at_shapes_world_examples():
    settings = _ice_settings()
    assert len(settings) >= 12
    wrong = [(path, key, value) for path, key, value in settings if value != GQA_ICES]
    assert wrong == []
