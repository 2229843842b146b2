"""Five ways ViperGPT's published programs failed against this runtime, each the runtime's fault:
`distance` of two numbers, the NExT-QA entry point's `query`, `VideoSegment.frame_from_index`, `np`
without an import, and a name made of digits ("17") that the oracle read as no words at all."""

from __future__ import annotations

import pytest
from vipergpt_world import obj, png, run, scene

from vprl.data.records import Example
from vprl.executor.api import ImagePatch, SourceImage, distance
from vprl.executor.host import ToolHost
from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.executor.tools.images import ImageStore
from vprl.executor.tools.oracle import OracleBackend

W, H = 320, 240


def test_distance_of_two_numbers_is_their_gap():
    # ViperGPT's RefCOCO prompt: distance(patch.horizontal_center, leftmost_coordinate) < 100
    assert distance(3, 10.5) == 7.5 and distance(10.5, 3) == 7.5
    image = SourceImage("x", W, H)
    with pytest.raises(TypeError, match="two ImagePatch or two numbers, got ImagePatch and float"):
        distance(ImagePatch(image, 0, 0, 10, 10), 2.0)
    with pytest.raises(TypeError, match="got bool and int"):
        distance(True, 1)


def test_the_nextqa_entry_point_gets_possible_answers_and_query(tmp_path):
    frames = tmp_path / "clip"
    frames.mkdir()
    scenes = {}
    for i in range(3):
        png(frames / f"{i:03d}.png", f"clip#{i}", W, H)
        scenes[f"clip#{i}"] = scene(W, H, a=obj("cat", 10 + 50 * i, 100, 40, 40))
    meta = {"possible_answers": ["left", "right"], "videoId": "clip"}
    example = Example("v", "nextqa", "video_qa", "where does the cat go", str(frames), ("right",), meta=meta)
    program = """
def execute_command(video, possible_answers, query)->[str, dict]:
    video_segment = VideoSegment(video)
    return possible_answers[1] if query.startswith("where") else possible_answers[0]
"""
    host = ToolHost(OracleBackend(ImageStore(), scenes=scenes), max_wait_ms=1.0)
    with SyncRunner(host, RunnerConfig(slots=1, timeout_s=5.0)) as runner:
        (result,) = runner.run([(example, program)])
    host.close()
    assert (result.status, result.answer, result.error) == ("ok", "right", None)


def test_video_segment_has_frame_from_index(tmp_path):
    scenes = {f"v#{i}": scene(W, H, a=obj("cat" if i == 2 else "dog", 10, 10, 50, 50)) for i in range(3)}
    program = """
def execute_command(video)->bool:
    video_segment = VideoSegment(video)
    return [video_segment.frame_from_index(-1).exists("cat"), video_segment.frame_from_index(0).exists("cat")]
"""
    outcome = run(program, scenes, tmp_path, video=list(scenes))
    assert (outcome.status, outcome.answer) == ("ok", [True, False]), outcome.error


def test_programs_see_numpy_as_np(tmp_path):
    program = """
def execute_command(image) -> str:
    image_patch = ImagePatch(image)
    sizes = [p.width for p in image_patch.find("cat")]
    return str(int(np.round(np.percentile(sizes, 90))))
"""
    graph = scene(W, H, a=obj("cat", 10, 10, 40, 40), b=obj("cat", 100, 10, 60, 40))
    outcome = run(program, {"img": graph}, tmp_path)
    assert (outcome.status, outcome.answer) == ("ok", "58"), outcome.error


def test_a_name_of_digits_is_a_word_to_the_oracle(tmp_path):
    program = """
def execute_command(image) -> str:
    image_patch = ImagePatch(image)
    players = image_patch.find("player")
    players.sort(key=lambda p: p.horizontal_center)
    return [p.exists("17") for p in players] + [image_patch.exists("number 23"), image_patch.exists("5")]
"""
    graph = scene(
        W, H, a=obj("player", 10, 20, 100, 200), b=obj("player", 200, 20, 100, 200),
        c=obj("17", 40, 60, 30, 30), d=obj("number", 230, 60, 30, 30, ["23"]),
    )  # fmt: skip
    outcome = run(program, {"img": graph}, tmp_path)
    # only the left player wears 17; "number 23" finds the number; nothing is 5
    assert (outcome.status, outcome.answer) == ("ok", [True, False, True, False]), outcome.error
