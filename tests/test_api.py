"""The image API's coordinate convention and error messages, pinned on a synthetic image with known boxes.

The image is 200x100 pixels with three painted blocks; the scene gives the oracle the same boxes in
top-left pixels. The API must report them bottom-left: `lower = H - y1`, `upper = H - y0`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from vprl.executor.api import (
    ImagePatch,
    SourceImage,
    Video,
    VideoSegment,
    bind_client,
    distance,
    get_middle_patch,
    get_patch_closest_to_anchor_object,
    process_guesses,
    sort_patches_bottom_to_top,
    sort_patches_front_to_back,
    sort_patches_left_to_right,
)
from vprl.executor.program import run_in_process
from vprl.executor.tools.images import ImageStore
from vprl.executor.tools.local import LocalToolClient
from vprl.executor.tools.oracle import OracleBackend

W, H = 200, 100
# name: (x0, y0, x1, y1) in top-left pixels, colour
BLOCKS = {
    "red": ((10, 10, 50, 40), (255, 0, 0)),
    "blue": ((60, 30, 100, 70), (0, 0, 255)),
    "green": ((120, 55, 180, 95), (0, 255, 0)),
}
# The same blocks in the API's (left, lower, right, upper), bottom-left origin.
API_BOX = {"red": (10, 60, 50, 90), "blue": (60, 30, 100, 70), "green": (120, 5, 180, 45)}


def _scene(objects: dict, width: int = W, height: int = H) -> dict:
    return {
        "width": width,
        "height": height,
        "objects": {
            oid: {"name": name, "x": x0, "y": y0, "w": x1 - x0, "h": y1 - y0, "attributes": attrs, "relations": []}
            for oid, (name, (x0, y0, x1, y1), attrs) in objects.items()
        },
    }


@pytest.fixture
def world(tmp_path):
    pixels = np.full((H, W, 3), 255, dtype=np.uint8)
    for (x0, y0, x1, y1), colour in BLOCKS.values():
        pixels[y0:y1, x0:x1] = colour
    Image.fromarray(pixels).save(tmp_path / "blocks.png")
    store = ImageStore()
    info = store.add_file(tmp_path / "blocks.png")
    scene = _scene({c: ("block", box, [c]) for c, (box, _) in BLOCKS.items()})
    backend = OracleBackend(
        store,
        scenes={"blocks": scene},
        llm_answers={
            "Question: What is this?\nTwo candidate answers: 'a cube' and 'a block'.\nGive the better short answer.": "a block"
        },
    )
    client = LocalToolClient(backend)
    image = SourceImage(info.ref, info.width, info.height)
    with bind_client(client):
        yield image, pixels, client


def _box(patch: ImagePatch) -> tuple[int, int, int, int]:
    return (patch.left, patch.lower, patch.right, patch.upper)


def _expected_crop(pixels: np.ndarray, colour: str) -> np.ndarray:
    x0, y0, x1, y1 = BLOCKS[colour][0]
    return pixels[y0:y1, x0:x1].transpose(2, 0, 1)


# -- coordinates ---------------------------------------------------------------------------------
def test_whole_image_patch(world):
    image, pixels, _ = world
    patch = ImagePatch(image)
    assert _box(patch) == (0, 0, W, H)
    assert (patch.width, patch.height) == (W, H)
    assert patch.cropped_image.shape == (3, H, W)
    np.testing.assert_array_equal(patch.cropped_image, pixels.transpose(2, 0, 1))


@pytest.mark.parametrize("colour", list(BLOCKS))
def test_find_reports_bottom_left_boxes_and_exact_pixels(world, colour):
    image, pixels, _ = world
    (found,) = ImagePatch(image).find(f"{colour} block")
    assert _box(found) == API_BOX[colour]
    assert found.cropped_image.shape == (3, found.height, found.width)
    np.testing.assert_array_equal(found.cropped_image, _expected_crop(pixels, colour))
    assert (found.cropped_image.transpose(1, 2, 0) == BLOCKS[colour][1]).all()


def test_vertical_center_grows_upward(world):
    image, _, _ = world
    blocks = {c: ImagePatch(image).find(f"{c} block")[0] for c in BLOCKS}
    # red is painted nearest the top row, green nearest the bottom row
    assert blocks["red"].vertical_center > blocks["blue"].vertical_center > blocks["green"].vertical_center
    assert blocks["red"].vertical_center > ImagePatch(image).vertical_center
    assert blocks["red"].horizontal_center < blocks["blue"].horizontal_center < blocks["green"].horizontal_center


def test_constructor_and_crop_use_original_image_coordinates(world):
    image, pixels, _ = world
    np.testing.assert_array_equal(ImagePatch(image, *API_BOX["red"]).cropped_image, _expected_crop(pixels, "red"))
    whole = ImagePatch(image)
    np.testing.assert_array_equal(whole.crop(*API_BOX["blue"]).cropped_image, _expected_crop(pixels, "blue"))
    # A crop of a crop is still in original-image coordinates and is clipped to its parent.
    (green,) = whole.find("green block")
    assert _box(green.crop(0, 0, W, H)) == API_BOX["green"]
    assert _box(green.crop(150, 0, W, 20)) == (150, 5, 180, 20)
    with pytest.raises(ValueError, match="does not overlap"):
        green.crop(0, 60, 50, 90)


def test_crop_relative_to_bbox(world):
    image, _, _ = world
    whole = ImagePatch(image)
    (blue,) = whole.find("blue block")
    args = (blue.left, blue.lower, blue.right, blue.upper)
    left, right = whole.crop_left_of_bbox(*args), whole.crop_right_of_bbox(*args)
    above, below = whole.crop_above_bbox(*args), whole.crop_below_bbox(*args)
    assert _box(left) == (0, 0, 60, H)
    assert _box(right) == (100, 0, W, H)
    assert _box(above) == (0, 70, W, H)
    assert _box(below) == (0, 0, W, 30)
    assert [p.category for p in left.find("block")] == ["block"] and left.exists("red block")
    assert right.exists("green block") and not right.exists("red block")
    assert above.exists("red block") and not above.exists("green block")
    assert below.exists("green block") and not below.exists("red block")


def test_overlaps_with(world):
    image, _, _ = world
    blue = ImagePatch(image, *API_BOX["blue"])
    assert not blue.overlaps_with(*API_BOX["red"])
    assert blue.overlaps_with(40, 40, 70, 80)
    assert blue.overlaps_with(100, 70, 120, 90)  # touching corners count, as in ViperGPT's listing


def test_distance_is_edge_gap_or_minus_iou(world):
    image, _, _ = world
    red, green = ImagePatch(image, *API_BOX["red"]), ImagePatch(image, *API_BOX["green"])
    assert distance(red, green) == pytest.approx(math.hypot(120 - 50, 60 - 45))
    assert distance(red, green) == distance(green, red)
    a, b = ImagePatch(image, 0, 0, 100, 100), ImagePatch(image, 50, 0, 150, 100)
    assert distance(a, b) == pytest.approx(-5000 / 15000)
    assert distance(a, a) == pytest.approx(-1.0)
    with pytest.raises(TypeError, match="two ImagePatch"):
        distance(a, API_BOX["red"])


def test_area(world):
    image, _, _ = world
    assert ImagePatch(image, *API_BOX["red"]).area == 40 * 30
    assert ImagePatch(image).area == W * H


def test_sort_routines_middle_and_closest(world):
    image, _, _ = world
    found = ImagePatch(image).find("block")
    red, blue, green = (ImagePatch(image, *API_BOX[c]) for c in ("red", "blue", "green"))
    assert sort_patches_left_to_right(found) == [red, blue, green]
    assert sort_patches_bottom_to_top(found) == [green, blue, red]
    assert get_middle_patch(found) == blue
    assert get_patch_closest_to_anchor_object([red, green], blue) == red
    assert get_patch_closest_to_anchor_object([red, blue, green], blue) == red  # the anchor itself is skipped


def test_depth_lower_in_image_is_nearer(world):
    image, _, _ = world
    found = ImagePatch(image).find("block")
    depth = {c: ImagePatch(image, *API_BOX[c]).compute_depth() for c in BLOCKS}
    assert depth["green"] < depth["blue"] < depth["red"]
    assert [_box(p) for p in sort_patches_front_to_back(found)] == [API_BOX[c] for c in ("green", "blue", "red")]


def test_best_text_match(world):
    image, _, _ = world
    (red,) = ImagePatch(image).find("red block")
    assert red.best_text_match(["green", "red", "blue"]) == "red"
    assert ImagePatch(image, *API_BOX["green"]).best_text_match(["a red block", "a green block"]) == "a green block"


def test_process_guesses_accepts_viper_list_form(world):
    # ViperGPT's OK-VQA example calls process_guesses(question, [guess, guess]).
    assert process_guesses("What is this?", ["a cube", "a block"]) == "a block"
    assert process_guesses("What is this?", "a cube", "a block") == "a block"
    assert process_guesses("What is this?", ["a block", "A block "]) == "a block"


# -- video ----------------------------------------------------------------------------------------
@pytest.fixture
def video(tmp_path):
    """Four 80x40 frames; in frame i a ball's left edge is at x = 10 + 15 i."""
    store, scenes, frames = ImageStore(), {}, []
    for i in range(4):
        pixels = np.zeros((40, 80, 3), dtype=np.uint8)
        pixels[0, 0] = i  # distinct content, so each frame is its own image
        Image.fromarray(pixels).save(tmp_path / f"frame{i}.png")
        info = store.add_file(tmp_path / f"frame{i}.png")
        scenes[f"frame{i}"] = _scene({"b": ("ball", (10 + 15 * i, 10, 20 + 15 * i, 20), ["red"])}, 80, 40)
        frames.append(SourceImage(info.ref, info.width, info.height))
    with bind_client(LocalToolClient(OracleBackend(store, scenes=scenes))):
        yield Video(frames)


def _ball_left(patch: ImagePatch) -> int:
    return patch.find("ball")[0].left


def test_video_segment_frames_trim_and_last_frame(video):
    segment = VideoSegment(video)
    assert (segment.start, segment.end, segment.num_frames) == (0, 4, 4)
    assert [_ball_left(f) for f in segment.frame_iterator()] == [10, 25, 40, 55]
    middle = segment.trim(1, 3)
    assert (middle.start, middle.end, middle.num_frames) == (1, 3, 2)
    assert [_ball_left(f) for f in middle.frame_iterator()] == [25, 40]
    inner = middle.trim(1, 10)  # clamped to the segment; start stays relative to the original video
    assert (inner.start, inner.end, inner.num_frames) == (2, 3, 1)
    assert _ball_left(ImagePatch(segment, -1)) == 55
    assert _ball_left(ImagePatch(middle, 0)) == 25
    assert repr(middle) == "VideoSegment(1, 3)"
    with pytest.raises(IndexError, match="outside the segment's 2 frames"):
        ImagePatch(middle, 2)


# -- errors a program sees (what the LLM reads when re-prompted) ---------------------------------
def _error_of(world, body: str) -> str:
    image, _, client = world
    source = "def execute_command(image):\n    image_patch = ImagePatch(image)\n" + body
    outcome, _, _ = run_in_process(source, {"image": image}, client)
    assert outcome.status == "runtime_error", outcome
    assert len(outcome.error) < 300, outcome.error
    return outcome.error


def test_box_outside_image_names_box_and_size(world):
    error = _error_of(world, "    return ImagePatch(image, 0, 0, 300, 50)\n")
    assert error.startswith("ValueError: ")
    assert "right=300" in error and "200x100" in error
    assert "(line 3: return ImagePatch(image, 0, 0, 300, 50))" in error


def test_invented_method_lists_real_ones(world):
    error = _error_of(world, "    return image_patch.find_all('block')\n")
    assert error.startswith("AttributeError: ImagePatch has no attribute 'find_all'; did you mean")
    assert "find" in error.split("did you mean", 1)[1]
    assert "line 3" in error


def test_invented_function_lists_real_ones(world):
    error = _error_of(world, "    return sort_patches_top_to_bottom(image_patch.find('block'))\n")
    assert error.startswith("NameError: name 'sort_patches_top_to_bottom' is not defined; did you mean")
    assert "did you mean sort_patches_bottom_to_top, " in error  # the same words first
    assert "line 3" in error


def test_find_with_a_list(world):
    error = _error_of(world, "    return image_patch.find(['block'])\n")
    assert error.startswith("TypeError: find() expects object_name to be a str, got list ['block']")


def test_verify_property_with_one_argument(world):
    error = _error_of(world, "    return image_patch.verify_property('red')\n")
    assert error.startswith("TypeError: ")
    assert "verify_property()" in error and "'visual_property'" in error


def test_list_used_as_patch(world):
    # ViUniT's re-prompt examples show this mistake; the message names the type and the attribute.
    error = _error_of(world, "    return image_patch.find('block').left\n")
    assert error.startswith("AttributeError: 'list' object has no attribute 'left'")
