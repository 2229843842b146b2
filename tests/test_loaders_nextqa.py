"""NExT-QA's multiple-choice release read into `video_qa` Examples: the CSV columns, the video path
through map_vid_vidorID.json (or a search of the video folders without it), the official type
groups, and bad rows named by file, line and column."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest

from vprl.data.loaders import DatasetFileNotFound, DatasetFormatError, SkippedRowsWarning, load_dataset
from vprl.data.loaders.nextqa import load_nextqa

FIX = Path(__file__).parent / "fixtures" / "datasets" / "nextqa"
HEADER = "video,frame_count,width,height,question,answer,qid,type,a0,a1,a2,a3,a4\n"


def test_the_release_layout_reads_into_video_questions():
    exs = load_dataset("nextqa", FIX)
    assert [e.id for e in exs][:2] == ["nextqa-1000000001_3", "nextqa-1000000001_5"]
    first = exs[0]
    assert (first.task, first.query, first.answers, first.group) == (
        "video_qa",
        "why does the girl pick up the ball",
        ("to throw it to the dog",),
        "CW",
    )
    assert first.image == str(FIX / "NExTVideo" / "0001" / "1000000001.mp4")
    assert first.meta["possible_answers"][1] == "to throw it to the dog" and first.meta["answer_index"] == 1
    assert first.meta["videoId"] == "1000000001" and first.meta["frame_count"] == 240
    # TP questions are scored with TN by the official evaluation
    assert [(e.meta["type"], e.group) for e in exs][-1] == ("TP", "TN")
    assert "num_frames" not in first.meta
    assert load_dataset("nextqa", FIX, num_frames=8)[0].meta["num_frames"] == 8


def test_without_the_map_the_video_is_found_in_its_folder(tmp_path):
    (tmp_path / "nextqa").mkdir()
    shutil.copy(FIX / "val.csv", tmp_path / "nextqa" / "val.csv")
    (tmp_path / "videos" / "0042").mkdir(parents=True)
    (tmp_path / "videos" / "0042" / "1000000002.mp4").write_bytes(b"")
    exs = load_dataset("nextqa", tmp_path)
    assert exs[2].image == str(tmp_path / "videos" / "0042" / "1000000002.mp4")
    with pytest.raises(DatasetFileNotFound, match=r"2 of 5 image file\(s\) missing: nextqa-1000000001_3"):
        load_dataset("nextqa", tmp_path, check_videos=True)


def _csv(tmp_path, *rows: str) -> Path:
    path = tmp_path / "val.csv"
    path.write_text(HEADER + "".join(r + "\n" for r in rows))
    return path


GOOD = "7,10,64,48,what is it,2,0,DO,a,b,c,d,e"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("7,10,64,48,what is it,5,0,DO,a,b,c,d,e", r"val.csv: line 3: 'answer' is 5, expected an option index 0-4"),
        ("7,10,64,48,what is it,x,0,DO,a,b,c,d,e", r"val.csv: line 3: 'answer' is 'x', expected a whole number"),
        ("7,10,64,48,what is it,1,0,XX,a,b,c,d,e", r"val.csv: line 3: 'type' is 'XX', expected one of CW, CH"),
        ("7,10,64,48,what is it,1,0,DO,a,b,,d,e", r"val.csv: line 3: empty 'a2'"),
        ("7,10,64,48,what is it,1,0,DO,a,b,c", r"val.csv: line 3: expected 13 fields"),
    ],
)
def test_a_bad_row_names_its_line_and_column(tmp_path, row, message):
    path = _csv(tmp_path, GOOD, row)
    with pytest.raises(DatasetFormatError, match=message):
        load_nextqa(path, tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exs = load_nextqa(path, tmp_path, skip_bad_rows=True)
    assert len(exs) == 1 and any(isinstance(w.message, SkippedRowsWarning) for w in caught)


def test_a_wrong_header_a_missing_map_entry_and_bad_options_are_named(tmp_path):
    bad_header = tmp_path / "bad.csv"
    bad_header.write_text("video,question,answer\n1,q,0\n")
    with pytest.raises(DatasetFormatError, match=r"bad.csv:1: the header lacks frame_count"):
        load_nextqa(bad_header, tmp_path)
    path = _csv(tmp_path, GOOD)
    (tmp_path / "map.json").write_text('{"8": "0001/8"}')
    with pytest.raises(DatasetFormatError, match=r"val.csv: line 2: video '7' is not in map.json"):
        load_nextqa(path, tmp_path, map_file=tmp_path / "map.json")
    with pytest.raises(ValueError, match="num_frames: expected a positive whole number, got 0"):
        load_nextqa(path, tmp_path, num_frames=0)
    with pytest.raises(DatasetFileNotFound, match="NExT-QA's test.csv"):
        load_dataset("nextqa", FIX, split="test")
