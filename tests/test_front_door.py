"""The front door (issue #36): the design card's `train/rl.py` command from a checkout, `import vprl`
with the public API and `__version__`, and the `vprl` console command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "COLUMNS": "100"}


def _python(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=240)


def test_item2_the_design_cards_command_runs_the_trainer(monkeypatch, capsys):
    from vprl.train.rl import main

    card = _python("train/rl.py", "--help")
    assert card.returncode == 0, card.stderr[-2000:]
    monkeypatch.setenv("COLUMNS", ENV["COLUMNS"])  # argparse wraps the help to the terminal's width
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert card.stdout == capsys.readouterr().out and "--model_name_or_path" in card.stdout


def test_item2_the_distribution_holds_vprl_alone():
    from setuptools import find_namespace_packages

    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = find_namespace_packages(where=str(REPO), include=find["include"], exclude=find.get("exclude", ()))
    assert "vprl" in packages and "vprl.train" in packages
    assert [p for p in packages if p.split(".")[0] != "vprl"] == []  # a user's own `train` package still wins
    assert (REPO / "train" / "rl.py").is_file() and not (REPO / "train" / "__init__.py").exists()


def test_item3_import_vprl_is_light_and_has_a_version():
    done = _python(
        "-c", "import sys, vprl; print(vprl.__version__); print(sorted({'torch', 'trl'} & set(sys.modules)))"
    )
    assert done.returncode == 0, done.stderr
    version, heavy = done.stdout.splitlines()
    assert version == metadata.version("vprl") and heavy == "[]"


def test_item3_every_public_name_imports_from_vprl():
    import importlib

    import vprl

    names = [n for n in vprl.__all__ if n != "__version__"]
    assert {"program_rewards", "trl_dataset", "load_examples", "register", "RLConfig", "RewardConfig"} <= set(names)
    for name in names:
        value = getattr(vprl, name)
        assert value is getattr(importlib.import_module(vprl._PUBLIC[name]), name), name
    namespace: dict = {}
    exec("from vprl import *", namespace)
    assert set(vprl.__all__) <= set(namespace)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        vprl.nothing  # noqa: B018


def test_item3_the_console_script_lists_the_commands():
    from vprl.cli import COMMANDS

    script = Path(sys.executable).parent / "vprl"
    assert script.is_file(), "no `vprl` console script: reinstall the package (pip install --no-deps -e .)"
    done = subprocess.run([str(script), "--help"], env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    listed = re.findall(r"^  (\S+)  ", done.stdout, flags=re.M)
    assert listed == list(COMMANDS) and {"train", "evaluate", "export", "view", "bootstrap", "quickstart"} <= set(
        listed
    )
    # a command is its module run as `python -m`: the same options
    view = subprocess.run([str(script), "view", "--help"], env=ENV, capture_output=True, text=True, timeout=120)
    assert view.returncode == 0 and view.stdout == _python("-m", "vprl.train.view", "--help").stdout
    wrong = subprocess.run([str(script), "trian"], env=ENV, capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "unknown command 'trian'" in wrong.stderr


def test_item3_every_documented_command_has_a_vprl_command():
    from vprl.cli import COMMANDS

    documented = set(re.findall(r"python -m (vprl(?:\.\w+)+)", (REPO / "README.md").read_text(encoding="utf-8")))
    assert documented and documented <= {module for module, _ in COMMANDS.values()}


def test_item3_the_reward_page_example_registers_a_working_reward():
    """docs/rewards.md's first example, run as written: the reward it registers scores by name."""
    import vprl
    from vprl.executor.results import ExecutionResult

    page = (REPO / "docs" / "rewards.md").read_text(encoding="utf-8")
    example = next(b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "register(" in b)
    exec(compile(example, "docs/rewards.md", "exec"), {})
    assert "short_programs" in vprl.reward_names()
    config = vprl.RewardConfig((vprl.RewardSpec("short_programs", settings={"max_lines": 2}),))
    examples = [vprl.Example(id=f"x{i}", dataset="gqa", task="vqa", query="q", image="i") for i in range(2)]
    results = [ExecutionResult(f"x{i}", "k", "ok", "a") for i in range(2)]
    batch = vprl.build_rewards(config)(examples, results, ["def f():\n    return 1", "a\nb\nc"])
    assert batch.totals == [1.0, 0.0]
