"""The run viewer's parts without a browser: traces to boxes and lines, advantages, sampling, the
rollout row's new field, the command line's bad input and help. The page itself, in Chromium, is
tests/test_view_page.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
from PIL import Image
from test_bad_input import run_main
from test_command_help import option_texts

from vprl.executor.results import short_result
from vprl.train.rollouts.log import RolloutLog, RolloutRow
from vprl.train.view import ViewOptions, build_view
from vprl.train.view.run_data import Row, advantages, pick_groups
from vprl.train.view.traces import SiteIndex, call_marks, detections

BOXES = [{"box": [10 * i, 5 * i, 10 * i + 30, 5 * i + 20], "score": 0.5 + i / 100, "label": "cup"} for i in range(6)]


def test_a_detect_result_cut_by_the_trace_keeps_every_whole_box_before_the_cut():
    whole = short_result(BOXES[:2])
    found, cut = detections(whole)
    assert not cut and [b[:4] for b in found] == [b["box"] for b in BOXES[:2]]
    assert found[0][4:] == [0.5, "cup"]
    cut_text = short_result(BOXES)  # the executor's cut (MAX_TRACE characters)
    assert cut_text.endswith("...")
    found, cut = detections(cut_text)
    assert cut and 1 <= len(found) < len(BOXES)
    assert [b[:4] for b in found] == [b["box"] for b in BOXES[: len(found)]]
    assert detections("[]") == ([], False) and detections('"red"') == ([], False)


PROGRAM = """def execute_command(image):
    image_patch = ImagePatch(image)
    cups = image_patch.find("cup")
    for name in ["plate", "fork"]:
        things = image_patch.find(name)
    if cups[0].verify_property("cup", "glass"):
        return cups[0].simple_query()
    return cups[0].simple_query("What color is the cup?")
"""


def test_call_lines_are_matched_by_their_literal_arguments_and_never_guessed():
    sites = SiteIndex(PROGRAM)
    assert sites.line_of("verify", {"object_name": "cup", "property": "glass"}) == 6
    assert sites.line_of("vqa", {"question": "What is this?"}) == 7  # simple_query() asks the default question
    assert sites.line_of("vqa", {"question": "What color is the cup?"}) == 8
    # find("cup") could come from line 3 or from find(name) on line 5: ambiguous, so no line
    assert sites.line_of("detect", {"noun": "cup", "threshold": None}) is None
    assert sites.line_of("depth", {}) is None
    assert SiteIndex("def execute_command(image:\n").line_of("vqa", {"question": "x"}) is None
    calls = [
        {
            "tool": "verify",
            "args": {"object_name": "cup", "property": "glass"},
            "box": [0, 0, 10, 10],
            "result": "true",
        },
        {"tool": "vqa", "args": {"question": "What is this?"}, "box": [0, 0, 10, 10], "result": '"x"', "line": 2},
    ]
    marks = call_marks(PROGRAM, calls, (10, 10))
    assert [(m.line, m.inferred) for m in marks] == [(6, True), (2, False)]  # a recorded line wins
    assert marks[0].label == 'verify_property("cup", "glass")'


def test_regions_are_drawn_top_left_and_the_whole_image_is_not_drawn():
    calls = [
        {"tool": "detect", "args": {"noun": "cup"}, "box": [0, 0, 200, 100], "result": short_result(BOXES[:1])},
        {"tool": "vqa", "args": {"question": "q"}, "box": [20, 10, 60, 40], "result": '"red"'},
    ]
    detect, vqa = call_marks("", calls, (200, 100))
    assert detect.region is None and detect.boxes[0][:4] == [0, 0, 30, 20]  # detector boxes are top-left already
    assert vqa.region == [20.0, 60.0, 60.0, 90.0]  # API (left, lower, right, upper) -> y from the top: 100-40, 100-10
    assert call_marks("", calls, None)[1].region is None  # no picture: nothing to draw on


def test_advantages_are_the_trainers():
    totals = [1.0, 0.0, -0.5, 1.0]
    r = torch.tensor(totals)
    grpo = ((r - r.mean()) / (r.std() + 1e-4)).tolist()  # trl's GRPO with scale_rewards "group"
    assert advantages(totals, "grpo", "group") == pytest.approx(grpo)
    assert advantages(totals, "grpo", "none") == pytest.approx((r - r.mean()).tolist())
    rloo = [t - (sum(totals) - t) / 3 for t in totals]
    assert advantages(totals, "rloo", None) == pytest.approx(rloo)
    masked = advantages([1.0, None, 0.0], "grpo", "group")
    assert masked[1] is None and masked[0] == pytest.approx(-masked[2])
    assert advantages(totals, "rest", None) == [None] * 4


def test_groups_are_drawn_evenly_across_steps():
    rows = [Row(s, f"e{g}", "", 0.0, "ok", None, 0, 0) for s in range(1, 101) for g in range(10) for _ in range(4)]
    groups = [list(range(i, i + 4)) for i in range(0, len(rows), 4)]
    picked = pick_groups(groups, rows, 250, seed=0)
    per_step = Counter(rows[g[0]].step for g in picked)
    assert len(picked) == 250 and set(per_step.values()) == {2, 3}  # 250 over 100 steps
    assert picked == sorted(picked, key=lambda g: (rows[g[0]].step, g[0]))
    assert pick_groups(groups, rows, 250, seed=0) == picked and pick_groups(groups, rows, 250, seed=1) != picked
    assert pick_groups(groups, rows, 5000, seed=0) == groups


def _row(step, example, total, status="ok", **kw):
    return RolloutRow(step=step, example_id=example, prompt_hash="h", program="p", status=status, total=total, **kw)


def test_old_rows_read_back_and_rows_without_unit_tests_are_written_as_before(tmp_path):
    old = _row(1, "e", 1.0).to_json()
    assert "unit_tests" not in old  # an empty field is left out: older readers see the rows they know
    assert RolloutRow.from_json(old) == _row(1, "e", 1.0)
    outcome = {
        "caption": "a red cup",
        "expected": "red",
        "status": "ok",
        "answer": "red",
        "score": 1.0,
        "image": "x.png",
    }
    row = _row(1, "e", 1.0, unit_tests=[outcome])
    assert RolloutRow.from_json(json.loads(json.dumps(row.to_json()))) == row
    with pytest.raises(ValueError, match=r"unit_tests"):
        RolloutRow.from_json({**old, "unit_tests": "passed"})


def _folder(tmp_path, steps=3, per_step=10, size=4) -> Path:
    run = tmp_path / "run"
    rows = [
        _row(
            s,
            f"q{g}",
            float(k % 2),
            tool_calls=[{"tool": "vqa", "args": {"question": "q"}, "box": None, "result": '"a"'}],
        )
        for s in range(1, steps + 1)
        for g in range(per_step)
        for k in range(size)
    ]
    RolloutLog.in_run(run).append(rows)
    return run


def test_a_large_run_is_sampled_and_the_page_says_which_rows_it_shows(tmp_path):
    run = _folder(tmp_path)
    result = build_view(run, ViewOptions(limit=5, use_examples=False))
    assert result["cards"] == 20 and result["page"] == run / "view" / "index.html"
    assert result["shown"].startswith("Showing 20 of 120 rollouts: 5 of 30 groups, drawn evenly across steps (seed 0")
    data = json.loads((run / "view" / "data.js").read_text().removeprefix("window.VIEW_DATA = ").rstrip(";\n"))
    assert data["curves"]["step"] == [1, 2, 3] and data["curves"]["n"] == [40, 40, 40]  # curves: every rollout
    assert data["curves"]["reward"] == [0.5, 0.5, 0.5] and data["curves"]["accuracy"] == [None, None, None]
    assert {c["s"] for c in data["cards"]} == {1, 2, 3} and all(len(g["cards"]) == 4 for g in data["groups"])
    only = build_view(run, ViewOptions(limit=100, steps=(2, 2), use_examples=False, out=tmp_path / "v2"))
    assert only["cards"] == 40 and "every group of steps 2 to 2" in only["shown"]
    with open(run / "rollouts.jsonl", "a") as f:
        f.write('{"step": 4, "example_id": "q0", "prom')  # a run killed mid-write: the torn line is dropped
    with pytest.warns(UserWarning, match=r"rollouts.jsonl:121: dropping a torn last line"):
        assert build_view(run, ViewOptions(limit=100, use_examples=False))["cards"] == 120


def test_the_command_writes_the_page_and_says_what_it_shows(tmp_path, monkeypatch, capsys):
    run = _folder(tmp_path)
    assert (
        run_main(
            "vprl.train.view", [str(run), "--no_examples", "--limit", "3", "--out", str(tmp_path / "v")], monkeypatch
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        out.startswith("Showing 12 of 120 rollouts: 3 of 30 groups")
        and f"view: {tmp_path / 'v' / 'index.html'}" in out
    )
    page = (tmp_path / "v" / "index.html").read_text()
    assert '<script src="data.js"></script>' in page  # nothing fetched from anywhere: the SVG namespace is a name
    assert "http" not in page.replace('"http://www.w3.org/2000/svg"', "")


def test_bad_input_is_one_line_with_exit_status_2(tmp_path, monkeypatch, capsys):
    def fails(argv, place):
        assert run_main("vprl.train.view", argv, monkeypatch) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "Traceback" not in err and re.search(place, err.splitlines()[0]), err

    fails([str(tmp_path / "nope")], r"nope: no such folder")
    fails([str(tmp_path)], r"neither a run folder \(rollouts.jsonl\) nor an evaluation folder")
    run = _folder(tmp_path)
    fails([str(run), "--steps", "3:1"], r"--steps: the first step 3 is after the last 1")
    fails([str(run), "--limit", "0"], r"--limit: .*must be >= 1")
    fails([str(run)], r"run/config.yaml: dataset_root: not set")  # the examples are needed, unless --no_examples
    lines = (run / "rollouts.jsonl").read_text().splitlines()
    lines[3] = lines[3].replace('"step": 1', '"step": "one"')
    (run / "rollouts.jsonl").write_text("\n".join(lines) + "\n")
    fails([str(run), "--no_examples"], r"rollouts.jsonl:4: step \(int\), example_id and status \(str\) are required")
    (tmp_path / "ev").mkdir()
    (tmp_path / "ev" / "predictions.jsonl").write_text('{"policy": "a"}\n')
    fails([str(tmp_path / "ev")], r"predictions.jsonl:1: missing field\(s\) \['mode'")


def test_every_option_has_help(monkeypatch, capsys):
    assert run_main("vprl.train.view", ["--help"], monkeypatch) == 0
    options = option_texts(capsys.readouterr().out)
    assert {"--out", "--limit", "--steps", "--no_examples", "--before", "--after"} <= set(options)
    assert all(options.values()), options


def _planted_run(tmp_path) -> tuple[Path, Path, str]:
    """A run folder with one unit-test picture (relative to the run), and a file outside it."""
    victim = tmp_path / "outside" / "victim.txt"
    victim.parent.mkdir()
    victim.write_text("precious")
    run = tmp_path / "run"
    (run / "pics").mkdir(parents=True)
    Image.new("RGB", (8, 8), "red").save(run / "pics" / "a.png")
    test = {"caption": "c", "expected": "x", "status": "ok", "answer": "x", "score": 1.0, "image": "pics/a.png"}
    RolloutLog.in_run(run).append([_row(1, "e", 1.0, unit_tests=[test])])
    return run, victim, hashlib.sha1((run / "pics" / "a.png").read_bytes()).hexdigest()[:20] + ".jpg"


def test_item3_links_planted_in_the_page_folder_are_replaced_never_written_through(tmp_path):
    run, victim, picture = _planted_run(tmp_path)
    view = run / "view"
    (view / "images").mkdir(parents=True)
    names = ["index.html.tmp", "data.js.tmp", "index.html", f"images/{picture}.tmp", f"images/{picture}"]
    for name in names:
        os.symlink(victim, view / name)
    result = build_view(run, ViewOptions(use_examples=False))
    assert victim.read_text() == "precious"
    assert result["images"] == 1
    for name in ("index.html", "data.js", f"images/{picture}"):
        assert (view / name).is_file() and not (view / name).is_symlink(), name
    assert not list(view.rglob("*.tmp"))


def test_item3_a_page_folder_that_is_a_link_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    run, victim, _ = _planted_run(tmp_path)
    os.symlink(victim.parent, run / "view")
    assert run_main("vprl.train.view", [str(run), "--no_examples"], monkeypatch) == 2
    err = capsys.readouterr().err
    assert re.match(r"error: .*run/view: a symlink; the viewer writes only into a folder of its own", err), err
    os.unlink(run / "view")
    (run / "view").mkdir()
    os.symlink(victim.parent, run / "view" / "images")
    assert run_main("vprl.train.view", [str(run), "--no_examples"], monkeypatch) == 2
    assert re.match(r"error: .*run/view/images: a symlink", capsys.readouterr().err)
    assert [p.name for p in victim.parent.iterdir()] == ["victim.txt"] and victim.read_text() == "precious"


@pytest.mark.parametrize(
    "change, place",
    [
        ({"tool_calls": ["x"]}, r"predictions.jsonl:2: tool_calls: expected a list of mappings"),
        ({"seed": [1]}, r"predictions.jsonl:2: seed: expected an integer, got list"),
        ({"mode": {"a": 1}}, r"predictions.jsonl:2: mode: expected a string, got dict"),
    ],
)
def test_item6_a_mistyped_evaluation_row_is_one_line_naming_file_line_and_key(
    tmp_path, monkeypatch, capsys, change, place
):
    (tmp_path / "ev").mkdir()
    row = {"policy": "a", "mode": "single", "dataset": "shapes:val", "seed": 0, "example_id": "e", "status": "ok"}
    (tmp_path / "ev" / "predictions.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(row | change) + "\n")
    assert run_main("vprl.train.view", [str(tmp_path / "ev"), "--no_examples"], monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and re.search(place, err.splitlines()[0]), err
    assert not (tmp_path / "ev" / "view" / "data.js").exists()


def test_item6_a_lone_surrogate_is_shown_as_such_and_leaves_no_temporary_file(tmp_path):
    run = tmp_path / os.fsdecode(b"run\xff")  # a folder name that is no UTF-8: it reaches the title
    row = _row(1, "e\ud800", 1.0).to_json() | {"program": "def execute_command(image):\n    return '\ud800'\n"}
    run.mkdir()
    (run / "rollouts.jsonl").write_text(json.dumps(row) + "\n")  # JSON escapes: the surrogate as the file has it
    page = build_view(run, ViewOptions(use_examples=False))["page"]
    data = json.loads((page.parent / "data.js").read_text().removeprefix("window.VIEW_DATA = ").rstrip(";\n"))
    assert data["cards"][0]["prog"] == row["program"] and data["cards"][0]["e"] == "e\ud800"
    assert "run\ufffd: programs of the run" in page.read_text(encoding="utf-8")
    assert not list(page.parent.rglob("*.tmp"))


def test_item3_a_link_planted_again_while_the_page_is_written_is_refused_not_followed(tmp_path, monkeypatch):
    from vprl.train.view import out_folder

    run, victim, _ = _planted_run(tmp_path)
    real_unlink = os.unlink

    def unlink_then_plant(name, *, dir_fd=None):
        try:
            real_unlink(name, dir_fd=dir_fd)
        finally:
            if name == "data.js.tmp":  # someone puts the link (back) between the unlink and the create
                os.symlink(victim, name, dir_fd=dir_fd)

    monkeypatch.setattr(out_folder.os, "unlink", unlink_then_plant)
    with pytest.raises(ValueError, match=r"view/data.js.tmp: made again by someone else while the page was written"):
        build_view(run, ViewOptions(use_examples=False))
    assert victim.read_text() == "precious"
