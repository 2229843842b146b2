"""#36 item 1: a non-editable install (what `pip install .` gives a user) carries what a user names.
The stack named `shapes` is the package's own YAML and runs a shapes-world program in the sandbox,
from a folder that is no checkout, and `vprl.paths` knows there is none."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Run in a folder of its own with only the installed copy of vprl on the path.
SCRIPT = """
import json
from pathlib import Path

import vprl
from vprl import paths
from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
from vprl.data.shapes.tasks import load_shapes_tasks
from vprl.executor.backends import open_backend
from vprl.executor.host import ToolHost
from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.executor.tools.stack import stack_names, stack_path

world = Path("world").resolve()
build_dataset(BuildConfig(out=str(world), train=2, val=3, winoground=0, sugarcrepe=0, refcoco=0, seed=0, workers=1))
gold = load_gold_programs(world)["vqa"]
examples = load_shapes_tasks(world, ["val"])["val"]
with SyncRunner(ToolHost(open_backend("shapes")), RunnerConfig(slots=1)) as runner:
    results = runner.run([(ex, gold[ex.query]) for ex in examples])
try:
    paths.checkout_file("configs/quickstart.yaml")
    refusal = None
except FileNotFoundError as exc:
    refusal = str(exc)
print(json.dumps({
    "vprl": vprl.__file__,
    "checkout": None if paths.CHECKOUT is None else str(paths.CHECKOUT),
    "stack": str(stack_path("shapes")),
    "named": stack_names(),
    "results": [[r.status, r.answer, ex.answers] for r, ex in zip(results, examples)],
    "refusal": refusal,
}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """vprl installed by pip, non-editable, into a folder of its own: no network (no build isolation,
    no dependencies: the test's interpreter has them)."""
    root = tmp_path_factory.mktemp("install")
    # pip builds inside the source folder (build/, *.egg-info): a copy keeps the checkout as it is.
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "vprl", source / "vprl", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    target = root / "site"
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
    proc = subprocess.run(
        [*command, "--target", str(target), str(source)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return target


def test_a_stack_named_shapes_works_from_a_non_editable_install(installed, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(installed)}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # the installed copy, not the checkout's editable one
    assert Path(report["vprl"]).is_relative_to(installed)
    assert report["stack"] == str(installed / "vprl" / "executor" / "tools" / "stacks" / "shapes.yaml")
    assert report["named"] == ["oracle", "shapes", "stanic", "vipergpt", "viunit"]  # every named stack ships
    assert report["checkout"] is None
    assert "only in a source checkout" in report["refusal"] and "\n" not in report["refusal"]
    statuses = [status for status, _, _ in report["results"]]
    assert statuses == ["ok"] * 3, report["results"]
    assert any(str(answer).lower() in answers for _, answer, answers in report["results"]), report["results"]
