"""The `shapes` backend: pixels only, the API's coordinate convention, and detector-like behaviour
on names it does not know."""

from __future__ import annotations

import numpy as np
import pytest

from vprl.data.shapes.render import render
from vprl.data.shapes.scene import SHAPES, Scene, ShapeObject, shape_box
from vprl.executor.api import ImagePatch, SourceImage, bind_client
from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.images import ImageStore
from vprl.executor.tools.local import LocalToolClient
from vprl.executor.tools.shapes import ShapesBackend, segment
from vprl.executor.tools.stack import build_backend


def make_object(i: int, shape: str, color: str, size: str, cx: int, cy: int, r: int, angle: float = 10.0):
    return ShapeObject(str(i), shape, color, size, cx, cy, r, angle, 0.0, *shape_box(shape, cx, cy, r, angle))


# A large red circle top-left, a small blue square bottom-right, a large green star bottom-left.
SCENE = Scene(
    "simple",
    256,
    256,
    (
        make_object(0, "circle", "red", "large", 60, 60, 26),
        make_object(1, "square", "blue", "small", 200, 200, 12),
        make_object(2, "star", "green", "large", 60, 190, 26),
    ),
    128,
)


@pytest.fixture()
def setup():
    images = ImageStore()
    backend = ShapesBackend(images)
    info = images.add_array(render(SCENE, np.random.default_rng(0)))
    client = LocalToolClient(backend)
    with bind_client(client):
        yield backend, info, ImagePatch(SourceImage(info.ref, info.width, info.height))


def test_stack_builds_the_shapes_backend():
    backend = build_backend({"backend": "shapes"})
    assert isinstance(backend, ShapesBackend) and backend.name == "shapes"
    assert backend.supports("detect") and not backend.supports("llm")


def test_finds_the_objects_in_the_api_convention(setup):
    _, _, image = setup
    (circle,) = image.find("red circle")
    (square,) = image.find("blue square")
    (star,) = image.find("star")
    # Top-left box (34, 34, 87, 87) of the circle is (left 34, lower 256-87, right 87, upper 256-34).
    assert abs(circle.left - 34) <= 1 and abs(circle.right - 87) <= 1
    assert abs(circle.lower - 169) <= 1 and abs(circle.upper - 222) <= 1
    assert circle.vertical_center > square.vertical_center  # higher in the picture = larger
    assert circle.horizontal_center < square.horizontal_center
    assert star.vertical_center < circle.vertical_center
    assert len(image.find("object")) == 3 and len(image.find("large objects")) == 2
    # Crops: only what lies in the region is found.
    top_half = image.crop(0, 128, 256, 256)
    assert [p.category for p in top_half.find("object")] == ["circle"]


def test_unknown_names_find_nothing(setup):
    _, _, image = setup
    for phrase in ("dog", "wooden circle", "chartreuse square", "transparent object", ""):
        assert isinstance(image.find(phrase), list)
    assert image.find("dog") == [] and image.find("chartreuse square") == [] and image.find("wooden circle") == []
    assert not image.verify_property("circle", "wooden")


def test_vqa_verify_itm_depth(setup):
    backend, info, image = setup
    (circle,) = image.find("circle")
    assert circle.simple_query("What color is the circle?") == "red"
    assert circle.simple_query("What shape is this?") == "circle"
    assert circle.simple_query("What size is it?") == "large"
    assert image.simple_query("How many squares are there?") == "1"
    assert image.simple_query("Is there a blue square?") == "yes"
    assert image.simple_query("Is there a red square?") == "no"
    assert circle.verify_property("circle", "red") and not circle.verify_property("circle", "blue")
    assert circle.best_text_match(["blue", "red"]) == "red"
    texts = ["a red circle to the left of a blue square", "a blue square to the left of a red circle"]
    scores = backend.itm([ToolCall("itm", info.ref, None, {"texts": texts})])[0]
    assert scores[0] > scores[1]
    (star,) = image.find("star")
    assert star.compute_depth() < circle.compute_depth()  # lower in the image = nearer


def test_segmentation_is_cached_per_image(setup, monkeypatch):
    backend, info, image = setup
    image.find("circle")
    calls = []
    import vprl.executor.tools.shapes.backend as mod

    monkeypatch.setattr(mod, "segment", lambda px: calls.append(1) or [])
    image.find("square")
    image.simple_query("What is this?")
    assert calls == []


@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_is_classified(shape):
    objects = tuple(
        make_object(i, shape, "orange", size, 50 + 80 * i, 128, r, angle)
        for i, (size, r, angle) in enumerate((("small", 12, 5.0), ("large", 26, 33.0), ("small", 13, 71.0)))
    )
    pixels = render(Scene("one", 256, 256, objects, 100), np.random.default_rng(1))
    found = segment(pixels)
    assert [(b.shape, b.color, b.size) for b in found] == [(shape, "orange", o.size) for o in objects]


def test_images_without_shapes_give_nothing():
    rng = np.random.default_rng(2)
    grey = np.clip(120 + rng.normal(0, 8, (64, 96, 1)), 0, 255).repeat(3, axis=2).astype(np.uint8)
    assert segment(grey) == []
    assert segment(np.zeros((1, 1, 3), np.uint8)) == []
