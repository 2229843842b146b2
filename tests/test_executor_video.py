"""Video examples (task video_qa) run through the runner: frames come from a video file or a
directory of frames, the program gets `(video, question, possible_answers)`."""

from __future__ import annotations

import contextlib

import cv2
import numpy as np
import pytest
from PIL import Image

from vprl.data.records import Example
from vprl.executor.host import ToolHost
from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.executor.tools.images import ImageStore
from vprl.executor.tools.oracle import OracleBackend

N_FRAMES, H, W = 6, 24, 32
BALL_FRAMES = (2, 3, 4)  # a ball is in these frames of the video (per the scene graphs)

# Tools (detect via the oracle, per frame) and pixels (the brightest frame) in one program.
PROGRAM = """
def execute_command(video, question, possible_answers):
    segment = VideoSegment(video)
    seen = [i for i, frame in enumerate(segment.frame_iterator()) if frame.exists("ball")]
    brightest = max(range(segment.num_frames), key=lambda i: int(segment.frame(i).pixels().mean()))
    answer = possible_answers[0] if question.startswith("when") else possible_answers[1]
    return [seen, brightest, segment.num_frames, list(video.shape), answer]
"""


def frame_pixels(i: int) -> np.ndarray:
    """Distinct flat frames, brighter and brighter (so their content hashes differ)."""
    pixels = np.zeros((H, W, 3), np.uint8)
    pixels[:, :] = (30 * i + 20, 10 * i, 200 - 20 * i)
    return pixels


def scenes(video_id: str) -> dict:
    out = {}
    for i in range(N_FRAMES):
        objects = {"0": {"name": "table", "x": 0, "y": 16, "w": 32, "h": 8, "attributes": [], "relations": []}}
        if i in BALL_FRAMES:
            objects["1"] = {"name": "ball", "x": 4 + 3 * i, "y": 4, "w": 6, "h": 6, "attributes": [], "relations": []}
        out[f"{video_id}#{i}"] = {"width": W, "height": H, "objects": objects}
    return out


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    root = tmp_path_factory.mktemp("video")
    movie = root / "clip.avi"
    writer = cv2.VideoWriter(str(movie), cv2.VideoWriter_fourcc(*"MJPG"), 5, (W, H))
    assert writer.isOpened()
    for i in range(N_FRAMES):
        writer.write(np.ascontiguousarray(frame_pixels(i)[:, :, ::-1]))  # OpenCV writes BGR
    writer.release()
    folder = root / "clip_frames"
    folder.mkdir()
    for i in range(N_FRAMES):
        Image.fromarray(frame_pixels(i)).save(folder / f"{i:04d}.png")
    return movie, folder


def world(videos):
    movie, folder = videos
    host = ToolHost(OracleBackend(ImageStore(), scenes={**scenes("clip"), **scenes("clip_frames")}), max_wait_ms=1.0)
    meta = {"possible_answers": ["at the start", "in the middle", "at the end"]}
    examples = [
        Example("v-file", "nextqa", "video_qa", "when does the ball appear?", str(movie), ("x",), meta=meta),
        Example("v-dir", "nextqa", "video_qa", "what happens?", str(folder), ("x",), meta=meta),
        Example("v-sampled", "nextqa", "video_qa", "when?", str(folder), ("x",), meta={**meta, "num_frames": 3}),
    ]
    return host, examples


@pytest.mark.parametrize("sandbox", ["full", "none"])
def test_video_examples_run_from_a_file_and_from_frames(videos, sandbox):
    host, examples = world(videos)
    warned = pytest.warns(RuntimeWarning) if sandbox == "none" else contextlib.nullcontext()
    with warned, SyncRunner(host, RunnerConfig(slots=2, timeout_s=5.0, sandbox=sandbox)) as runner:
        results = runner.run([(ex, PROGRAM) for ex in examples])
    assert [r.status for r in results] == ["ok"] * 3, [(r.status, r.error) for r in results]
    by_id = {r.example_id: r.answer for r in results}
    # Every frame, decoded from the file (lossy MJPG keeps the order of brightness) or read exactly.
    assert by_id["v-file"] == [list(BALL_FRAMES), N_FRAMES - 1, N_FRAMES, [N_FRAMES, 3, H, W], "at the start"]
    assert by_id["v-dir"] == [list(BALL_FRAMES), N_FRAMES - 1, N_FRAMES, [N_FRAMES, 3, H, W], "in the middle"]
    # Three evenly spaced frames: 0, 2 and 5 of the video; the ball is in the middle one.
    assert by_id["v-sampled"] == [[1], 2, 3, [3, 3, H, W], "at the start"]
    assert all(r.tool_calls and r.tool_calls[0].tool == "detect" for r in results)
    host.close()


def test_frames_keep_their_index_in_the_video(videos):
    host, _ = world(videos)
    _, folder = videos
    frames = host.add_video(folder, num_frames=3)
    assert [f.image_id for f in frames] == ["clip_frames#0", "clip_frames#2", "clip_frames#5"]
    assert np.array_equal(frames[1].load_pixels(), frame_pixels(2))
    assert host.add_video(folder, num_frames=3) is frames  # decoded once
    with pytest.raises(ValueError, match="num_frames"):
        host.add_video(folder, num_frames=0)
    host.close()


def test_a_missing_video_is_our_failure_not_the_programs(videos, tmp_path):
    host, examples = world(videos)
    missing = Example("v-missing", "nextqa", "video_qa", "when?", str(tmp_path / "nope.mp4"), ("x",))
    with SyncRunner(host, RunnerConfig(slots=1, timeout_s=5.0)) as runner:
        (result,) = runner.run([(missing, PROGRAM)])
    assert result.status == "infra_error" and result.error.startswith("video:"), result
    host.close()


def test_item4_a_video_path_that_is_a_fifo_or_a_device_is_refused_not_opened(videos, tmp_path):
    """#37 item 4 for videos: OpenCV opens a video by name, so a FIFO would block the tool host for
    good and a device would never end; each is refused first and masks its example only."""
    import os

    fifo = tmp_path / "clip.mp4"
    os.mkfifo(fifo)
    host, examples = world(videos)
    hostile = [
        Example("v-fifo", "nextqa", "video_qa", "when?", str(fifo), ("x",)),
        Example("v-device", "nextqa", "video_qa", "when?", "/dev/zero", ("x",)),
    ]
    with SyncRunner(host, RunnerConfig(slots=1, timeout_s=5.0)) as runner:
        results = runner.run([(ex, PROGRAM) for ex in hostile])
    assert [r.status for r in results] == ["infra_error", "infra_error"], results
    assert "not a regular file (a FIFO)" in results[0].error and "a character device" in results[1].error, results
    host.close()
