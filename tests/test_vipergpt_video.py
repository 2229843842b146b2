"""The video half of the API, end to end on the CPU: programs in the style of ViperGPT's API prompt
(its VideoSegment docstrings) and of its NExT-QA prompt run unchanged, the NExT-QA ones on
questions read by the NExT-QA loader from the release's CSV format, on small MP4 files written
here, decoded by the executor, answered by the oracle (and the rule language model of
tests/vipergpt_world.py for `select_answer`), and scored with NExT-QA's official metric.

The programs are ours, in the style of the prompt files: ViperGPT's entry point
`execute_command(video, possible_answers, query)`, `np` used without an import, `frame_from_index`
(negative indices too), `frame_iterator` with `enumerate`, `trim`, `best_text_match` with keyword
arguments, and `VideoSegment.select_answer` with an info dict.
"""

from __future__ import annotations

import csv
import json

import cv2
import numpy as np
import pytest
from vipergpt_world import RuleLanguageModel, obj, run, scene

from vprl.data.loaders import load_dataset
from vprl.executor.host import ToolHost
from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.executor.tools.images import ImageStore
from vprl.train.evaluation.metrics import Prediction, dataset_metrics

W, H, FRAMES = 64, 48, 8
VIDEO = "2000000001"
BALL_FROM = 3  # the ball is in the frames from this one on


def frame_scene(i: int) -> dict:
    """Frame `i` of the video: a girl (holding a frisbee in the last frame), a dog that sits, then
    runs once the ball is there, and a second dog in frames 4 and 5."""
    objects = {
        "girl": obj("girl", 2, 6, 16, 40, relations=[("holding", "frisbee")] if i == FRAMES - 1 else []),
        "dog": obj("dog", 24, 30, 14, 12, ["running" if i >= BALL_FROM else "sitting", "brown"]),
    }
    if i == FRAMES - 1:
        objects["frisbee"] = obj("frisbee", 12, 20, 6, 4, ["white"])
    if i >= BALL_FROM:
        objects["ball"] = obj("ball", 48, 36, 8, 8, ["red"])
    if i in (4, 5):
        objects["dog2"] = obj("dog", 40, 10, 12, 10, ["sitting", "black"])
    return scene(W, H, **objects)


def frame_pixels(i: int) -> np.ndarray:
    pixels = np.zeros((H, W, 3), np.uint8)
    pixels[:, :] = (25 * i + 20, 12 * i, 200 - 20 * i)  # every frame its own content
    return pixels


# -- the API prompt's VideoSegment docstrings ------------------------------------------------------
API_VIDEO = {
    "frame_from_index": (
        """
def execute_command(video)->bool:
    video_segment = VideoSegment(video)
    for i, frame in enumerate(video_segment.frame_iterator()):
        if frame.exists("ball"):
            frame_after = video_segment.frame_from_index(i+1)
            return frame_after.exists("dog")
""",
        True,
    ),
    "trim": (
        """
def execute_command(video):
    video_segment = VideoSegment(video)
    video_second_half = video_segment.trim(video_segment.num_frames // 2, video_segment.num_frames)
    return video_second_half
""",
        {"segment": [FRAMES // 2, FRAMES]},
    ),
    "frame_iterator": (
        """
def execute_command(video):
    video_segment = VideoSegment(video)
    for i, frame in enumerate(video_segment.frame_iterator()):
        if frame.exists("girl") and frame.exists("frisbee") and frame.simple_query("What is the girl holding?") == "frisbee":
            return i
""",
        FRAMES - 1,
    ),
}


@pytest.mark.parametrize(("program", "answer"), API_VIDEO.values(), ids=list(API_VIDEO))
def test_the_api_prompts_video_programs_run_unchanged(program, answer, tmp_path):
    scenes = {f"{VIDEO}#{i}": frame_scene(i) for i in range(FRAMES)}
    outcome = run(program, scenes, tmp_path, video=list(scenes))
    assert (outcome.status, outcome.answer) == ("ok", answer), outcome.error


# -- the NExT-QA prompt, on questions in the release's format ------------------------------------------
# (type, question, options, answer index, program)
NEXTQA = [
    (
        "DC",
        "how many dogs are there in the video",
        ["one", "two", "three", "four", "five"],
        1,
        """
def execute_command(video, possible_answers, query)->[str, dict]:
    video_segment = VideoSegment(video)
    # Count the dogs in every frame; the most seen at once is how many there are
    num_dogs_all_frames = []
    for i, frame in enumerate(video_segment.frame_iterator()):
        num_dogs_all_frames.append(len(frame.find("dog")))
    num_dogs = int(np.max(num_dogs_all_frames))
    # Create the info dictionary
    info = {"Number of dogs": num_dogs}
    # Answer the query
    answer = video_segment.select_answer(info, query, possible_answers)
    return answer
""",
    ),
    (
        "TN",
        "what does the dog do after the ball appears",
        ["sleeping", "running", "eating", "barking", "jumping"],
        1,
        """
def execute_command(video, possible_answers, query)->[str, dict]:
    video_segment = VideoSegment(video)
    # Find when the ball appears
    ball_detected = False
    for i, frame in enumerate(video_segment.frame_iterator()):
        if frame.exists("ball"):
            ball_detected = True
            break
    if ball_detected:
        index_frame = i + 1  # Note the "after" in the question
    else:
        index_frame = video_segment.num_frames // 2
    frame_of_interest = video_segment.frame_from_index(index_frame)
    dogs = frame_of_interest.find("dog")
    if len(dogs) == 0:
        dogs = [frame_of_interest]
    dog = dogs[0]
    # Caption the crop
    caption = dog.simple_query("What is the dog doing?")
    info = {"What the dog does after the ball appears": caption}
    answer = video_segment.select_answer(info, query, possible_answers)
    return answer
""",
    ),
    (
        "DO",
        "what color is the ball",
        ["green", "red", "blue", "white", "black"],
        1,
        """
def execute_command(video, possible_answers, query)->[str, dict]:
    video_segment = VideoSegment(video)
    frame_of_interest = video_segment.frame_from_index(video_segment.num_frames // 2)
    ball_patches = frame_of_interest.find("ball")
    if len(ball_patches) == 0:
        ball_patches = [frame_of_interest]
    # Classify the color among the provided options
    color_detected = ball_patches[0].best_text_match(prefix="ball", option_list=possible_answers)
    info = {"Color of the ball": color_detected}
    answer = video_segment.select_answer(info, query, possible_answers)
    return answer
""",
    ),
    (
        "TC",
        "what is the girl holding at the end of the video",
        ["ball", "cup", "frisbee", "bag", "phone"],
        2,
        """
def execute_command(video, possible_answers, query)->[str, dict]:
    video_segment = VideoSegment(video)
    # Caption the last frame of the video (end of video)
    last_frame = video_segment.frame_from_index(-1)
    girls = last_frame.find("girl")
    if len(girls) == 0:
        girls = [last_frame]
    girl = girls[0]
    holding = girl.simple_query("What is the girl holding?")
    info = {"The girl at the end holds": holding}
    answer = video_segment.select_answer(info, query, possible_answers)
    return answer
""",
    ),
    (
        "CH",
        "how does the dog wait at the beginning",
        ["running", "sitting", "jumping", "lying", "eating"],
        1,
        # Stanić et al.'s argument order and name, next to ViperGPT's
        """
def execute_command(video, question, possible_answers):
    video_segment = VideoSegment(video)
    beginning = video_segment.trim(0, 3)  # the first frames ("at the beginning")
    actions = []
    for frame in beginning.frame_iterator():
        for dog in frame.find("dog"):
            actions.append(dog.simple_query("What is the dog doing?"))
    info = {"The dog at the beginning": ", ".join(actions)}
    return beginning.select_answer(info, question, possible_answers)
""",
    ),
]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A NExT-QA root in the release's layout: val.csv, map_vid_vidorID.json, NExTVideo/<dir>/<id>.mp4."""
    root = tmp_path_factory.mktemp("nextqa")
    (root / "NExTVideo" / "0007").mkdir(parents=True)
    writer = cv2.VideoWriter(
        str(root / "NExTVideo" / "0007" / f"{VIDEO}.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 8, (W, H)
    )
    assert writer.isOpened()
    for i in range(FRAMES):
        writer.write(np.ascontiguousarray(frame_pixels(i)[:, :, ::-1]))  # OpenCV writes BGR
    writer.release()
    (root / "map_vid_vidorID.json").write_text(json.dumps({VIDEO: f"0007/{VIDEO}"}))
    with open(root / "val.csv", "w", newline="") as fh:
        rows = csv.writer(fh)
        rows.writerow(
            [
                "video",
                "frame_count",
                "width",
                "height",
                "question",
                "answer",
                "qid",
                "type",
                "a0",
                "a1",
                "a2",
                "a3",
                "a4",
            ]
        )
        for qid, (qtype, question, options, answer, _) in enumerate(NEXTQA):
            rows.writerow([VIDEO, FRAMES, W, H, question, answer, qid, qtype, *options])
    return root


def test_nextqa_programs_run_unchanged_end_to_end_and_score_by_the_official_metric(release):
    examples = load_dataset("nextqa", release)
    assert [e.query for e in examples] == [q for _, q, *_ in NEXTQA]
    scenes = {f"{VIDEO}#{i}": frame_scene(i) for i in range(FRAMES)}
    host = ToolHost(RuleLanguageModel(ImageStore(), scenes), max_wait_ms=1.0)
    pairs = [(e, program) for e, (*_, program) in zip(examples, NEXTQA)]
    with SyncRunner(host, RunnerConfig(slots=2, timeout_s=10.0)) as runner:
        results = runner.run(pairs)
    host.close()
    assert [(r.status, r.error) for r in results] == [("ok", None)] * len(NEXTQA)
    assert [r.answer for r in results] == [e.answers[0] for e in examples]
    m = dataset_metrics(examples, [Prediction(r.example_id, r.answer, r.status) for r in results])
    assert m.headline == {"accuracy": 1.0, "causal": 1.0, "temporal": 1.0, "descriptive": 1.0}
    assert m.counted["temporal"] == 2 and set(m.per_group) == {"DC", "TN", "DO", "TC", "CH"}
