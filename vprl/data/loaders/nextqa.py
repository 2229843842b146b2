"""NExT-QA (multiple choice) in its official release format: question CSVs and the video files.

The release (the NExT-QA repository's `dataset/nextqa/`) has `train.csv`, `val.csv` and `test.csv`
with the header::

    video,frame_count,width,height,question,answer,qid,type,a0,a1,a2,a3,a4

`video` is the video id, `answer` the index (0-4) of the right option among `a0`..`a4`, `qid` the
question's number within its video (the official question id is `<video>_<qid>`), `type` the
question type: CW/CH (causal: why, how), TN/TC/TP (temporal: before-after, when, and the previous/
next questions the official evaluation counts with TN) and DC/DL/DO (descriptive: count, location,
other). `map_vid_vidorID.json`, beside the CSVs, maps a video id to `<folder>/<VidOR id>`; the
videos (NExTVideo) are `<videos_dir>/<folder>/<VidOR id>.mp4`. Without the map the video is looked
up as `<videos_dir>/*/<video>.mp4`, the layout ViperGPT's NExT-QA reader expects.

Each row is one `video_qa` Example: `image` is the video file (the executor decodes it with
OpenCV, `vprl/executor/host.py`), `answers` the right option's text, `group` the official type (TP
counted as TN), and meta holds what the official metric and the entry point need:
`possible_answers` (the five options, in order), `answer_index`, `type` (as written), `qid`,
`video` and `videoId` (frame `i` of the video becomes image `<video>#<i>`). `num_frames`, when
given, sets how many evenly spaced frames a program gets (the executor's default otherwise).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from vprl.data.loaders._common import (
    BadRows,
    DatasetFormatError,
    check_image_files,
    first_existing,
    load_json,
    require_file,
)
from vprl.data.loaders.rows import RowError
from vprl.data.records import Example

COLUMNS = (
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
)
OPTIONS = ("a0", "a1", "a2", "a3", "a4")
# Question types of the release, and the group the official evaluation scores each in.
TYPE_GROUP = {"CW": "CW", "CH": "CH", "TN": "TN", "TC": "TC", "TP": "TN", "DC": "DC", "DL": "DL", "DO": "DO"}
CSV_EXPECTED = "a NExT-QA multiple-choice CSV like val.csv (dataset/nextqa/ of the NExT-QA release)"
MAP_FILE = "map_vid_vidorID.json"
MAP_EXPECTED = f"NExT-QA's {MAP_FILE} (video id -> <folder>/<VidOR id>)"


def _int(row: dict[str, str], key: str, where: str) -> int:
    text = row[key].strip()
    try:
        return int(text)
    except ValueError:
        raise RowError(f"{where}: '{key}' is {text!r}, expected a whole number") from None


def parse_row(row: dict[str, str], where: str, video_path, dataset: str, num_frames: int | None) -> Example:
    """One CSV row as an Example; raises RowError naming the line and column that are wrong."""
    for key in ("video", "question", "qid", "type", *OPTIONS):
        if not (row.get(key) or "").strip():
            raise RowError(f"{where}: empty '{key}'")
    video, qid, qtype = row["video"].strip(), row["qid"].strip(), row["type"].strip()
    if qtype not in TYPE_GROUP:
        raise RowError(f"{where}: 'type' is {qtype!r}, expected one of {', '.join(TYPE_GROUP)}")
    index = _int(row, "answer", where)
    if not 0 <= index < len(OPTIONS):
        raise RowError(f"{where}: 'answer' is {index}, expected an option index 0-{len(OPTIONS) - 1}")
    options = [row[key].strip() for key in OPTIONS]
    meta: dict[str, Any] = {
        "video": video,
        "videoId": video,
        "qid": qid,
        "type": qtype,
        "answer_index": index,
        "possible_answers": options,
    }
    for key in ("frame_count", "width", "height"):
        if (row.get(key) or "").strip():
            meta[key] = _int(row, key, where)
    if num_frames is not None:
        meta["num_frames"] = num_frames
    return Example(
        id=f"{dataset}-{video}_{qid}",
        dataset=dataset,
        task="video_qa",
        query=row["question"].strip(),
        image=str(video_path(video, where)),
        answers=(options[index],),
        group=TYPE_GROUP[qtype],
        meta=meta,
    )


def _video_finder(videos_dir: Path, map_file: Path | None):
    """`video id -> path of its .mp4`: through the map when there is one, else by a one-level search."""
    if map_file is not None:
        mapping = load_json(map_file, MAP_EXPECTED)

        def mapped(video: str, where: str) -> Path:
            if video not in mapping or not isinstance(mapping[video], str):
                raise RowError(f"{where}: video {video!r} is not in {map_file.name}")
            return videos_dir / f"{mapping[video]}.mp4"

        return mapped
    found = {p.stem: p for pattern in ("*/*.mp4", "*.mp4") for p in sorted(videos_dir.glob(pattern))}

    def searched(video: str, where: str) -> Path:
        # A video not found is reported when it is opened (or by check_videos), like a missing image.
        return found.get(video, videos_dir / f"{video}.mp4")

    return searched


def load_nextqa(
    csv_path: str | Path,
    videos_dir: str | Path,
    *,
    map_file: str | Path | None = None,
    dataset: str = "nextqa",
    num_frames: int | None = None,
    skip_bad_rows: bool = False,
    check_videos: bool = False,
) -> list[Example]:
    """Read one NExT-QA multiple-choice CSV into `video_qa` Examples, in file order."""
    path = require_file(csv_path, CSV_EXPECTED)
    if num_frames is not None and (isinstance(num_frames, bool) or not isinstance(num_frames, int) or num_frames < 1):
        raise ValueError(f"num_frames: expected a positive whole number, got {num_frames!r}")
    video_path = _video_finder(Path(videos_dir), Path(map_file) if map_file else None)
    bad = BadRows(path, skip_bad_rows)
    out: list[Example] = []
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise DatasetFormatError(
                    f"{path}:1: the header lacks {', '.join(missing)}; expected {','.join(COLUMNS)} ({CSV_EXPECTED})"
                )
            for row in reader:
                where = f"line {reader.line_num}"
                try:
                    if None in row or any(v is None for v in row.values()):
                        raise RowError(f"{where}: expected {len(reader.fieldnames)} fields")
                    out.append(parse_row(row, where, video_path, dataset, num_frames))
                except RowError as err:
                    bad.handle(err)
    except UnicodeDecodeError as exc:
        raise DatasetFormatError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    bad.finish()
    if check_videos:
        check_image_files(out)
    return out


def load_nextqa_root(
    root: str | Path,
    split: str = "val",
    *,
    csv_file: str | Path | None = None,
    map_file: str | Path | None = None,
    videos_dir: str | Path | None = None,
    dataset: str = "nextqa",
    num_frames: int | None = None,
    skip_bad_rows: bool = False,
    check_videos: bool = False,
) -> list[Example]:
    """The release layout: `<root>/<split>.csv` (or under `nextqa/` or `dataset/nextqa/`) with
    `map_vid_vidorID.json` beside it when present, videos in `<root>/NExTVideo/` (or `videos/`).
    `check_videos` fails listing the questions whose video file is missing."""
    root = Path(root)
    if csv_file:
        csv_path = Path(csv_file)
    else:
        name = f"{split}.csv"
        folders = [root, root / "nextqa", root / "dataset" / "nextqa"]
        csv_path = first_existing([f / name for f in folders], f"NExT-QA's {name} ({CSV_EXPECTED})")
    if map_file is None and (csv_path.parent / MAP_FILE).is_file():
        map_file = csv_path.parent / MAP_FILE
    if videos_dir is None:
        # Like images, videos are not looked at until a program opens one (or check_videos asks).
        candidates = [root / "NExTVideo", root / "videos"]
        videos_dir = next((c for c in candidates if c.is_dir()), candidates[0])
    return load_nextqa(
        csv_path,
        videos_dir,
        map_file=map_file,
        dataset=dataset,
        num_frames=num_frames,
        skip_bad_rows=skip_bad_rows,
        check_videos=check_videos,
    )
