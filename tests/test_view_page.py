"""The run viewer's page in a real headless Chromium, built from a short CPU run of the quickstart
recipe and from a shapes evaluation: no console error, the cards shown, boxes drawn where the trace
says (independently of the viewer's own conversion), filters that change what is shown, and a
screenshot kept as a test artifact ($VPRL_ARTIFACTS, else the test's temporary folder).

Chromium comes from the system's packages; where it is missing these tests skip outside CI and fail
in CI (`VPRL_CI` or `CI` set)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from chromium import Browser, browser_or_skip
from PIL import Image
from view_runs import quickstart_run, shapes_evaluation

from vprl.data.shapes.tasks import load_shapes_tasks
from vprl.train.rollouts.log import RolloutLog
from vprl.train.view import ViewOptions, build_view
from vprl.train.view.traces import CALL_SITES

# Where every drawn box sits, as a share of its picture's rendered width and height.
BOXES_JS = """(async () => {
  const cards = Array.from(document.querySelectorAll('.card'));
  for (const img of document.querySelectorAll('.frame img')) { img.loading = 'eager'; await img.decode(); }
  return cards.flatMap(card => {
    const img = card.querySelector('.frame img'); if (!img) return [];
    const f = img.getBoundingClientRect();
    return Array.from(card.querySelectorAll('svg rect.box')).map(r => { const b = r.getBoundingClientRect();
      return {card: +card.dataset.card, call: r.parentNode.dataset.call, cls: r.getAttribute('class'),
              x0: (b.left - f.left) / f.width, y0: (b.top - f.top) / f.height,
              x1: (b.right - f.left) / f.width, y1: (b.bottom - f.top) / f.height}; });
  });
})()"""
SHOWN_JS = "Array.from(document.querySelectorAll('#main .card')).map(c => [+c.dataset.card, c.dataset.status])"
COUNT_JS = "+document.getElementById('count').dataset.count"


def set_filter(browser: Browser, element: str, value: str) -> None:
    """Set a filter as a reader would: the value, then the event its listener waits for."""
    browser.eval(
        f"(() => {{ const el = document.getElementById('{element}'); el.value = {json.dumps(value)};"
        " el.dispatchEvent(new Event(el.tagName === 'SELECT' ? 'change' : 'input')); })()"
    )


def page_data(page: Path) -> dict:
    return json.loads((page.parent / "data.js").read_text().removeprefix("window.VIEW_DATA = ").rstrip(";\n"))


@pytest.fixture(scope="module")
def browser():
    with browser_or_skip() as b:
        yield b


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("view")
    world, policy, run = quickstart_run(root)
    return world, run, shapes_evaluation(root, policy, run / "adapter")


@pytest.fixture
def artifacts(tmp_path) -> Path:
    out = Path(os.environ.get("VPRL_ARTIFACTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _all_pages(browser: Browser, script: str) -> list:
    """`script`'s list on every page of the current view, first page to last."""
    found = []
    while True:
        found += browser.eval(script)
        page, pages = browser.eval("document.getElementById('pageno').textContent").split()[1::2]
        if page == pages:
            return found
        browser.eval("document.getElementById('next').click()")


def test_the_run_page_draws_each_call_where_its_trace_says(browser, folders, artifacts):
    world, run, _ = folders
    result = build_view(run)
    data = page_data(result["page"])
    rows = RolloutLog.in_run(run).read()
    assert result["cards"] == len(rows) == 32  # 2 steps x 4 prompts x 4 samples: all shown
    browser.open(result["page"].as_uri())
    assert browser.errors() == []
    assert browser.eval(COUNT_JS) == 32 and len(browser.eval(SHOWN_JS)) == 24  # the first page of 24
    assert browser.eval("document.querySelectorAll('.chart').length") == 4  # the curves

    # Expected boxes straight from rollouts.jsonl and the image files, not through the viewer's code.
    images = {e.id: e.image for e in load_shapes_tasks(world, ["train"])["train"]}
    expected = {}
    for i, card in enumerate(data["cards"]):
        (row,) = [r for r in rows if (r.step, r.example_id, r.program) == (card["s"], card["e"], card["prog"])][:1]
        width, height = Image.open(images[row.example_id]).size
        for n, call in enumerate(row.tool_calls, 1):
            if call["tool"] == "detect":
                for x0, y0, x1, y1 in (d["box"] for d in json.loads(call["result"])):
                    expected.setdefault((i, str(n), "det"), []).append(
                        [x0 / width, y0 / height, x1 / width, y1 / height]
                    )
            elif call["box"] != [0, 0, width, height]:
                left, lower, right, upper = call["box"]  # API convention: origin bottom-left
                box = [left / width, (height - upper) / height, right / width, (height - lower) / height]
                expected.setdefault((i, str(n), "region"), []).append(box)
    assert any(k[2] == "det" for k in expected) and any(k[2] == "region" for k in expected)
    drawn = {}
    for b in _all_pages(browser, BOXES_JS):
        drawn.setdefault((b["card"], b["call"], b["cls"].split()[1]), []).append([b["x0"], b["y0"], b["x1"], b["y1"]])
    assert drawn.keys() == expected.keys()
    for key, boxes in expected.items():
        assert drawn[key] == [pytest.approx(box, abs=0.01) for box in boxes], key

    # Every call's line was recorded by the executor (none matched from the source), on a line of
    # the program that calls the API function behind the call's tool; the page tags it there.
    marks = [(card, m) for card in data["cards"] for m in card["calls"]]
    assert marks and all(m["line"] is not None and not m["inf"] for _, m in marks)
    for card, m in marks:
        text = card["prog"].split("\n")[m["line"] - 1]
        assert any(f"{name}(" in text for name in CALL_SITES[m["tool"]]), (m, text)
    shown_calls = sum(len(data["cards"][i]["calls"]) for i, _ in browser.eval(SHOWN_JS))
    assert browser.eval("document.querySelectorAll('#main pre.prog .tag[title]').length") == shown_calls > 0
    browser.screenshot(artifacts / "view_run.png")

    # A filter changes what is shown: only the syntax errors, then one step's groups.
    set_filter(browser, "f-st", "syntax_error")
    shown = browser.eval(SHOWN_JS)
    assert shown and {s for _, s in shown} == {"syntax_error"}
    assert browser.eval(COUNT_JS) == sum(r.status == "syntax_error" for r in rows) < 32
    set_filter(browser, "f-st", "")
    browser.eval("document.querySelector('[data-view=groups]').click()")
    set_filter(browser, "f-smin", "2")
    groups = browser.eval(
        "Array.from(document.querySelectorAll('.group')).map(g => g.querySelectorAll('.card').length)"
    )
    assert groups == [4, 4, 4, 4] and browser.eval(COUNT_JS) == 4  # step 2's groups, G=4 samples side by side
    assert browser.errors() == []


def test_the_evaluation_page_compares_the_policies_and_filters_by_change(browser, folders, artifacts):
    _, _, evaluation = folders
    result = build_view(evaluation)
    data = page_data(result["page"])
    kinds = [p["k"] for p in data["pairs"]]
    assert data["policies"] == ["before_rl", "after_rl"] and {"fixed", "broken", "both_right"} <= set(kinds)
    browser.open(result["page"].as_uri())
    assert browser.errors() == []
    assert browser.eval(COUNT_JS) == len(kinds)
    # predictions.jsonl carries each program's trace: the cards draw its boxes, at recorded lines
    assert not any(c.get("nt") for c in data["cards"])
    marks = [m for c in data["cards"] for m in c["calls"]]
    assert marks and all(m["line"] is not None and not m["inf"] for m in marks)
    assert any(b["cls"] == "box det" for b in browser.eval(BOXES_JS))
    for kind in ("broken", "fixed"):
        set_filter(browser, "f-kind", kind)
        assert browser.eval(COUNT_JS) == kinds.count(kind)
        pairs = browser.eval("Array.from(document.querySelectorAll('.pair')).map(p => p.dataset.kind)")
        assert pairs == [kind] * min(12, kinds.count(kind))
        # each pair: the same question, before on the left, after on the right
        cards = browser.eval(SHOWN_JS)
        assert [data["cards"][i]["pol"] for i, _ in cards] == ["before_rl", "after_rl"] * len(pairs)
    set_filter(browser, "f-kind", "")
    set_filter(browser, "f-task", "grounding")
    boxes = browser.eval(BOXES_JS)
    gold = [b for b in boxes if b["cls"] == "box gold"]
    assert gold, "a referring expression's gold box is drawn"
    examples = {e.id: e for e in load_shapes_tasks(evaluation.parent / "eval_world", ["refcoco"])["refcoco"]}
    for box in gold:
        example = examples[data["cards"][box["card"]]["e"]]
        width, height = Image.open(example.image).size
        left, lower, right, upper = example.box  # API convention: origin bottom-left
        assert [box[k] for k in ("x0", "y0", "x1", "y1")] == pytest.approx(
            [left / width, (height - upper) / height, right / width, (height - lower) / height], abs=0.01
        )
    browser.screenshot(artifacts / "view_eval.png")
    assert browser.errors() == []


def test_unit_test_outcomes_recorded_in_rows_show_per_program(browser, folders, tmp_path):
    world, run, _ = folders
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoint-*", "adapter", "view"))
    picture = sorted((world / "gqa" / "images").glob("*.png"))[0]
    rows = RolloutLog.in_run(copy).read()
    lines = []
    for row in rows:
        data = row.to_json()
        data["unit_tests"] = [  # the first test passes for the programs that ran, the second fails for all
            {
                "caption": "a red triangle",
                "expected": "red",
                "status": "ok",
                "answer": "red",
                "score": float(row.status == "ok"),
                "image": str(picture),
            },
            {
                "caption": "a blue square",
                "expected": "blue",
                "status": "runtime_error",
                "answer": None,
                "score": 0.0,
                "image": str(picture),
            },
        ]
        lines.append(json.dumps(data))
    (copy / "rollouts.jsonl").write_text("\n".join(lines) + "\n")
    page = build_view(copy, ViewOptions(dataset_root=str(world)))["page"]
    browser.open(page.as_uri())
    browser.eval("document.querySelector('[data-view=tests]').click()")
    tables = browser.eval("document.querySelectorAll('table.ut').length")
    assert tables == len({r.query for r in rows})
    marks = browser.eval(
        "Array.from(document.querySelectorAll('table.ut tr[data-card]')).map(r => "
        "[+r.dataset.card, Array.from(r.querySelectorAll('.pass,.fail')).map(s => s.textContent)])"
    )
    cards = page_data(page)["cards"]
    assert len(marks) == len(rows)
    assert all(m == (["pass", "fail"] if cards[i]["st"] == "ok" else ["fail", "fail"]) for i, m in marks)
    assert browser.eval("document.querySelectorAll('table.ut img').length") == 2 * tables
    assert browser.errors() == []


def test_a_repair_episode_shows_its_turns_side_by_side(browser, folders, tmp_path, artifacts):
    """A repair run's cards (#35): every program that ended an episode of two turns shows the first
    turn (its program, status, tool calls and the feedback it was shown) beside the final program."""
    from vprl.rewards.feedback import Feedback
    from vprl.train.repair.episode import Episode, Turn
    from vprl.train.repair.log import EpisodeLog, episodes_path

    world, run, _ = folders
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoint-*", "adapter", "view"))
    rows = RolloutLog.in_run(copy).read()
    log = EpisodeLog(episodes_path(copy))
    for k, row in enumerate(rows):
        final = Turn(
            row.program, row.status, row.answer, row.error, row.total, row.components, True, None, row.tool_calls
        )
        turns = (final,)
        if k % 2 == 0:  # every other program was written after a first one that failed
            first = Turn(f"{row.program}# first turn {k}\n", "runtime_error", error="IndexError: list index out of range",
                         feedback=Feedback(("error",), f"It raised an exception (turn {k})"),
                         tool_calls=row.tool_calls)  # fmt: skip
            turns = (first, final)
        log([Episode(row.example_id, turns)], row.step)
    page = build_view(copy, ViewOptions(dataset_root=str(world)))["page"]
    cards = page_data(page)["cards"]
    # a group may hold one program twice: the n-th card of a program is its n-th row
    order: dict[tuple, list[int]] = {}
    for k, row in enumerate(rows):
        order.setdefault((row.step, row.example_id, row.program), []).append(k)
    expected = [i for i, c in enumerate(cards) if order[c["s"], c["e"], c["prog"]].pop(0) % 2 == 0]
    assert expected and [i for i, c in enumerate(cards) if c.get("turns")] == expected
    browser.open(page.as_uri())
    shown = _all_pages(
        browser,
        "Array.from(document.querySelectorAll('#main .card.episode')).map(c => [+c.dataset.card,"
        " Array.from(c.querySelectorAll('.turn')).map(t => { const b = t.getBoundingClientRect();"
        " return [+t.dataset.turn, b.left, b.top, b.width, t.querySelector('pre.prog').textContent,"
        " (t.querySelector('pre.feedback') || {}).textContent || null]; })])",
    )
    assert sorted(i for i, _ in shown) == expected
    for i, turns in shown:
        (n1, left1, top1, width1, prog1, fb1), (n2, left2, top2, _, prog2, fb2) = turns
        assert (n1, n2) == (1, 2) and top1 == top2 and left2 >= left1 + width1  # side by side
        first = cards[i]["turns"][0]
        assert "# first turn" in prog1 and "# first turn" not in prog2 and fb2 is None
        assert fb1 == first["feedback"] and fb1.startswith("It raised an exception")
    browser.screenshot(artifacts / "view_repair_episodes.png")
    assert browser.errors() == []


def test_the_wandb_program_table_carries_the_picture_with_the_boxes(folders, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from types import SimpleNamespace

    from vprl.train.online.callbacks import ProgramTable

    world, run, _ = folders
    rows = RolloutLog.in_run(run).read()
    images = {e.id: e.image for e in load_shapes_tasks(world, ["train"])["train"]}
    logged = []
    monkeypatch.setattr(wandb, "run", object())
    monkeypatch.setattr(wandb, "log", logged.append)
    ProgramTable(SimpleNamespace(recent=rows), 1, images=images).on_step_end(
        None, SimpleNamespace(is_world_process_zero=True, global_step=7), None
    )
    # wandb names the table's file after its key: the optimizer step's, not wandb's own step, which
    # runs ahead of it (#29 item 3)
    assert set(logged[0]) == {"programs/step_7", "train/global_step"} and logged[0]["train/global_step"] == 7
    # How wandb serializes the table it uploads (the artifact of a logged table).
    table = logged[0]["programs/step_7"].to_json(wandb.Artifact("programs", "run_table"))
    assert table["columns"][-1] == "image"
    for row, cells in zip(rows, table["data"]):
        image = cells[-1]
        assert image["_type"] == "image-file"
        drawn = [b["position"] for b in image.get("boxes", {}).get("tool_calls", [])]
        found = [d["box"] for c in row.tool_calls if c["tool"] == "detect" for d in json.loads(c["result"])]
        for x0, y0, x1, y1 in found:  # the shapes images (256 px) are not scaled down
            assert {"minX": x0, "minY": y0, "maxX": x1, "maxY": y1} in drawn
