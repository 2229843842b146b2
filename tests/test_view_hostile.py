"""The run viewer on folders written by someone hostile (#37 items 2 and 4): every field of a run's
rows and of an evaluation's predictions holds markup, quotes, `javascript:` URLs and lone
surrogates, and every image path a row or the dataset names is a FIFO, a device, a private file, an
absolute path outside, a symlink out of the folder. In a real headless Chromium no injected handler
runs, and no file outside the folder and its dataset roots is opened by the viewer, copied into the
page or loaded by the browser."""

from __future__ import annotations

import contextlib
import hashlib
import html
import json
import os
import re
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml
from chromium import Browser, browser_or_skip
from PIL import Image
from test_safe_files import within

from vprl.train.rollouts.log import RolloutLog, RolloutRow
from vprl.train.view import ViewOptions, build_view

# Each would set window.__pwned (and the title) if the page ever parsed it as markup or a URL.
PAYLOADS = [
    "<img src=x onerror=\"window.__pwned=(window.__pwned||0)+1;document.title='PWNED'\">",
    '</script><script>window.__pwned=1;document.title="PWNED"</script>',
    '"><svg onload="window.__pwned=1"><a href=\'javascript:window.__pwned=1\'>x</a>',
    "' onmouseover='window.__pwned=1' x='",
    "javascript:window.__pwned=1",
    "lone \ud800 surrogate <b onclick=window.__pwned=1>",
    "__JS__ __CSS__ __TITLE__ \u2028\u2029",
]
PAGE_STATE_JS = "({pwned: window.__pwned === undefined ? null : window.__pwned, title: document.title})"
VIEWS_JS = "Array.from(document.querySelectorAll('#bar [data-view]')).map(b => b.dataset.view)"


def hostile(i: int) -> str:
    return PAYLOADS[i % len(PAYLOADS)]


class Opened:
    """Every path the process opens while recording (the `open` audit event: builtins.open, os.open)."""

    paths: list[str] | None = None
    installed = False

    @classmethod
    @contextlib.contextmanager
    def recording(cls):
        if not cls.installed:
            sys.addaudithook(cls._hook)  # hooks cannot be removed: this one records only when asked
            cls.installed = True
        cls.paths = []
        try:
            yield cls.paths
        finally:
            cls.paths = None

    @classmethod
    def _hook(cls, event: str, args: tuple) -> None:
        if event == "open" and cls.paths is not None and isinstance(args[0], str | bytes | os.PathLike):
            cls.paths.append(os.fsdecode(args[0]))


def absolute(opened: list[str]) -> list[str]:
    """The paths opened by name; the others are the viewer's own files, opened relative to its page folder."""
    own = [p for p in opened if not os.path.isabs(p) and p != "<unknown>"]  # <unknown>: source of compiled code
    assert all(p == "images" or p.endswith(".tmp") for p in own), own
    return [p for p in opened if os.path.isabs(p)]


def png(path: Path, color: tuple[int, int, int]) -> bytes:
    Image.new("RGB", (40, 30), color).save(path)
    return path.read_bytes()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """A tiny shapes world whose questions point at hostile image files, and files outside it."""
    from rl_tiny import build_world

    root = tmp_path_factory.mktemp("hostile")
    world = build_world(root / "world")
    outside = root / "outside"
    outside.mkdir()
    secrets = {name: png(outside / f"{name}.png", (200, 10 * i, 10)) for i, name in enumerate(("secret", "far"))}
    images = world / "gqa" / "images"
    os.mkfifo(images / "fifo.png")
    os.symlink("/dev/zero", images / "zero.png")
    os.symlink("/etc/passwd", images / "passwd.png")
    os.symlink(outside / "secret.png", images / "link.png")
    hostile_ids = ["fifo", "zero", "passwd", "link", str(outside / "far")]  # the last: an absolute path
    for split in ("train", "val"):
        path = world / "gqa" / f"{split}_balanced_questions.json"
        questions = json.loads(path.read_text())
        for question, image_id in zip(list(questions.values())[1:], hostile_ids):
            question["imageId"] = image_id
        path.write_text(json.dumps(questions))
    return {"root": root, "world": world, "outside": outside, "secrets": secrets}


def unit_tests(run: Path, outside: Path, i: int) -> list[dict]:
    """Unit-test outcomes whose images are good (relative to the run folder) or hostile."""
    fifo = run / "unit_test_cache" / "fifo.png"
    images = [
        "unit_test_cache/ok.png",
        "/dev/zero",
        "/etc/passwd",
        str(fifo),
        str(outside / "secret.png"),
        "../outside/secret.png",
        "unit_test_cache/out.png",
        "elsewhere.png",  # is in the working directory, not in the run folder
        hostile(i),
    ]
    return [
        {"caption": hostile(i + k), "expected": hostile(i + k + 1), "status": hostile(k), "answer": hostile(k + 2),
         "score": 1.0 if k % 2 else hostile(k), "image": image}
        for k, image in enumerate(images)
    ]  # fmt: skip


def hostile_run(root: Path, world: Path, outside: Path) -> Path:
    from vprl.data.shapes.tasks import load_shapes_tasks

    run = root / "run <img src=x onerror=window.__pwned=1> '\""
    (run / "unit_test_cache").mkdir(parents=True)
    png(run / "unit_test_cache" / "ok.png", (10, 200, 10))
    os.mkfifo(run / "unit_test_cache" / "fifo.png")
    os.symlink(outside / "secret.png", run / "unit_test_cache" / "out.png")
    config = {"dataset": "shapes", "dataset_root": str(world), "dataset_tasks": ["train"], "num_generations": 2}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    examples = load_shapes_tasks(world, ["train"])["train"][:7] + [None]
    rows = []
    for i, example in enumerate(examples):
        for k in range(2):
            n = 2 * i + k
            rows.append(
                RolloutRow(
                    step=1 + i % 2,
                    example_id=example.id if example else hostile(n),
                    prompt_hash=hostile(n),
                    program=f"def execute_command(image):\n    x = {hostile(n)!r}\n    return {hostile(n + 1)!r}\n",
                    status=["ok", hostile(n)][k],
                    answer=[hostile(n), {"box": hostile(n + 1)}][k],
                    components={hostile(n): 0.5, "correctness": float(k)},
                    total=float(k),
                    query=hostile(n + 2),
                    dataset=hostile(n + 3),
                    task=hostile(n + 4),
                    group=hostile(n + 5),
                    program_key=hostile(n),
                    error=hostile(n + 6),
                    policy=hostile(n + 1),
                    tool_calls=[
                        {
                            "tool": "detect",
                            "args": {"noun": hostile(n)},
                            "box": [0, 0, 40, 30],
                            "line": 2,
                            "result": json.dumps([{"box": [1, 2, 20, 20], "score": 0.9, "label": hostile(n + 1)}]),
                        },
                        {
                            "tool": "vqa",
                            "args": {"question": hostile(n + 2)},
                            "box": [5, 5, 30, 25],
                            "line": 3,
                            "result": json.dumps(hostile(n + 3)),
                        },
                        {
                            "tool": hostile(n),
                            "args": {hostile(n): hostile(n + 1)},
                            "box": [hostile(n)] * 4,
                            "result": hostile(n + 2),
                            "line": hostile(n),
                        },
                    ],  # fmt: skip
                    unit_tests=unit_tests(run, outside, n),
                )
            )
    # As JSON escapes: a lone surrogate can be in a file only so (the log itself writes UTF-8)
    RolloutLog.in_run(run).path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    return run


def hostile_evaluation(root: Path, world: Path) -> Path:
    from vprl.data.shapes.tasks import load_shapes_tasks

    folder = root / "eval <svg onload=window.__pwned=1> '\""
    folder.mkdir()
    config = {"shapes_root": str(world), "datasets": "shapes:val", "data_roots": ""}
    (folder / "evaluation.json").write_text(json.dumps({"config": config}))
    rows = []
    for i, example in enumerate(load_shapes_tasks(world, ["val"])["val"]):
        for k, policy in enumerate((hostile(i), hostile(i + 1))):
            n = 2 * i + k
            rows.append(
                {
                    "policy": policy,
                    "mode": hostile(n),
                    "dataset": "shapes:val",
                    "seed": n,
                    "example_id": example.id,
                    "status": ["ok", hostile(n)][k],
                    "program": hostile(n + 2),
                    "answer": hostile(n + 3),
                    "error": hostile(n + 4),
                    "fallback_answer": hostile(n + 5),
                    "unit_test_score": 0.5,
                    "tool_calls": [
                        {
                            "tool": "vqa",
                            "args": {"question": hostile(n)},
                            "box": [1, 1, 9, 9],
                            "result": json.dumps(hostile(n + 1)),
                            "line": 1,
                        }
                    ],
                }  # fmt: skip
            )
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def walk(browser: Browser, page: Path) -> None:
    """Open the page and show every tab, every page of it, hovering each card; then check that no
    injected handler ran and that the page loaded nothing but its own files."""
    browser.call("Network.enable")  # every URL the page asks for, its own file included
    browser.open(page.as_uri())
    for view in browser.eval(VIEWS_JS):
        browser.eval(f"document.querySelector('#bar [data-view={view}]').click()")
        while True:
            browser.eval(
                "document.querySelectorAll('#main *').forEach(e => e.dispatchEvent(new MouseEvent('mouseover',"
                " {bubbles: true})))"
            )
            page_no, pages = browser.eval("document.getElementById('pageno').textContent").split()[1::2]
            if page_no == pages:
                break
            browser.eval("document.getElementById('next').click()")
    browser.eval("new Promise(r => setTimeout(r, 300))")  # an injected image's onerror fires after its failed load
    assert browser.eval(PAGE_STATE_JS) == {"pwned": None, "title": written_title(page)}
    text = browser.eval("document.body.innerText")
    assert "<img src=x onerror=" in text and "</script><script>" in text  # shown as the text it is
    browser.eval("0")  # flush the events that came before this point
    loaded = [e["params"]["request"]["url"] for e in browser.events if e["method"] == "Network.requestWillBeSent"]
    assert all(unquote(url).startswith(unquote(page.parent.as_uri()) + "/") for url in loaded), loaded
    assert any(url.endswith("/data.js") for url in loaded)
    assert any("/images/" in url for url in loaded) == bool(page_data(page)["images"])
    assert browser.errors() == []


def written_title(page: Path) -> str:
    """The page's <title> as the viewer wrote it (what document.title is unless a script changed it)."""
    written = re.search(r"<title>(.*)</title>", page.read_text(), re.DOTALL).group(1)
    return " ".join(html.unescape(written).split())


def page_data(page: Path) -> dict:
    return json.loads((page.parent / "data.js").read_text().removeprefix("window.VIEW_DATA = ").rstrip(";\n"))


def copied(view: Path) -> set[str]:
    return {p.name for p in (view / "images").iterdir()}


def thumb_name(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()[:20] + ".jpg"


@pytest.fixture(scope="module")
def browser():
    with browser_or_skip() as b:
        yield b


def test_item2_and_item4_a_hostile_run_folder_runs_nothing_and_reads_nothing_outside(world, browser, tmp_path):
    run = hostile_run(world["root"], world["world"], world["outside"])
    png(tmp_path / "elsewhere.png", (1, 2, 3))
    forbidden = {str(world["outside"]), "/etc/passwd", "/dev/zero", str(tmp_path)}
    with contextlib.chdir(tmp_path), within(60), Opened.recording() as opened:  # a FIFO is opened without blocking
        result = build_view(run)
    assert not [p for p in absolute(opened) if any(f in os.path.realpath(p) or f in p for f in forbidden)], opened
    view = run / "view"
    secrets = {thumb_name(data) for data in world["secrets"].values()}
    assert not copied(view) & secrets and thumb_name((tmp_path / "elsewhere.png").read_bytes()) not in copied(view)
    assert thumb_name((run / "unit_test_cache" / "ok.png").read_bytes()) in copied(view)  # relative to the run
    data = page_data(result["page"])
    refused = {c["noimg"] for c in data["cards"] if c["noimg"]} | {t["noimg"] for c in data["cards"] for t in c["ut"]}
    for path in ("fifo.png: not a regular file (a FIFO)", "/dev/zero: outside", "/etc/passwd: outside", "link.png"):
        assert any(path in (why or "") for why in refused), (path, refused)
    assert any("image path(s) refused" in note for note in data["notes"])
    assert result["cards"] == 16 and "\\ud800" in (view / "data.js").read_text()
    assert not list(view.rglob("*.tmp"))
    walk(browser, result["page"])
    assert browser.eval("document.querySelectorAll('.nopic[data-why^=refused]').length") > 0


def test_item2_and_item4_a_hostile_evaluation_folder_runs_nothing_and_reads_nothing_outside(world, browser):
    folder = hostile_evaluation(world["root"], world["world"])
    with within(60), Opened.recording() as opened:
        result = build_view(folder)
    outside = str(world["outside"])
    assert not [p for p in absolute(opened) if outside in os.path.realpath(p) or p in ("/etc/passwd", "/dev/zero")]
    assert not copied(folder / "view") & {thumb_name(data) for data in world["secrets"].values()}
    walk(browser, result["page"])
    # the same rows without the examples: every dataset name hostile too
    lines = (folder / "predictions.jsonl").read_text().splitlines()
    rows = [json.loads(line) | {"dataset": hostile(i)} for i, line in enumerate(lines)]
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    walk(browser, build_view(folder, ViewOptions(use_examples=False, out=folder / "bare"))["page"])


def poisoned(data: dict) -> dict:
    """`data` with every value the page shows replaced by markup, whatever type the viewer wrote:
    the page must stay safe even where the Python side let something through."""
    n = iter(range(10**6))
    data.update(title=hostile(next(n)), shown=hostile(next(n)), notes=[hostile(next(n))])
    data["policies"] = [hostile(next(n)), hostile(next(n))]
    for card in data["cards"]:
        for key in set(card) - {"calls", "ut", "img", "abox", "gbox"}:
            card[key] = hostile(next(n))
        card["comp"] = {hostile(next(n)): hostile(next(n))}
        for mark in card["calls"]:
            mark.update({k: hostile(next(n)) for k in ("i", "tool", "label", "res", "line", "inf", "cut")})
            for box in mark["boxes"]:
                box[4:] = [hostile(next(n)), hostile(next(n))]
        for test in card.get("ut", []):
            test.update({k: hostile(next(n)) for k in set(test) - {"img"}})
    for group in data.get("groups", []):
        group["s"] = hostile(next(n))
    for pair in data.get("pairs", []):
        pair.update(k=hostile(next(n)), mode=hostile(next(n)), seed=hostile(next(n)))
    return data


@pytest.mark.parametrize("kind", ["run", "evaluation"])
def test_item2_every_field_of_the_page_data_holding_markup_stays_text(world, browser, kind, tmp_path):
    folder = (
        hostile_run(tmp_path, world["world"], world["outside"])
        if kind == "run"
        else hostile_evaluation(tmp_path, world["world"])
    )
    page = build_view(folder)["page"]
    data = poisoned(page_data(page))
    (page.parent / "data.js").write_text("window.VIEW_DATA = " + json.dumps(data) + ";\n")
    walk(browser, page)
