"""The guides name only things that exist: every repository path in docs/gpu.md (and the other
guides), every `python -m` module and every script a command runs."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GUIDES = [
    "docs/gpu.md",
    "docs/distributed.md",
    "docs/architecture.md",
    "docs/vllm-cpu.md",
    "docs/configs.md",
    "README.md",
]
OURS = (
    "configs/",
    "vprl/train/",
    "bench/",
    "docs/",
    "vprl/executor/",
    "vprl/rewards/",
    "tests/",
    "vprl/data/loaders",
    "vprl/data/shapes",
)


def _spans(text: str) -> list[str]:
    """Inline code spans and the lines of fenced code blocks."""
    fenced = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return inline + [line for block in fenced for line in block.splitlines()]


def _paths(span: str) -> list[str]:
    out = []
    for token in re.split(r"[\s,()=\[\]]+", span):
        token = token.strip("'\"").split("::")[0].rstrip(".:;")
        placeholder = re.search(r"[<>*{}#]|(^|/)X(\.|/|$)", token)  # configs/X.yaml, <run>, {a,b}
        if token.startswith(OURS) and not placeholder:
            out.append(token)
    return out


@pytest.mark.parametrize("guide", GUIDES)
def test_every_path_a_guide_names_exists(guide):
    missing = sorted(
        {p for span in _spans((REPO / guide).read_text()) for p in _paths(span) if not (REPO / p).exists()}
    )
    assert missing == []


@pytest.mark.parametrize("guide", GUIDES)
def test_every_module_a_guide_runs_exists(guide):
    modules = {m for span in _spans((REPO / guide).read_text()) for m in re.findall(r"python3? -m ([\w.]+)", span)}
    modules -= {"pip"}
    missing = sorted(m for m in modules if importlib.util.find_spec(m) is None)
    assert modules and missing == [] if guide == "docs/gpu.md" else missing == []


def test_the_gpu_guide_is_linked_from_the_readme():
    assert "docs/gpu.md" in (REPO / "README.md").read_text()


def test_item5_the_guides_view_the_folders_the_quickstart_writes():
    from vprl.train.quickstart import QuickstartConfig, rl_run_name

    cfg = QuickstartConfig()
    written = {f"{cfg.out}/{rl_run_name(cfg)}", f"{cfg.out}/eval/{rl_run_name(cfg)}"}
    named = set()
    for guide in ("README.md", "docs/view.md"):
        for span in _spans((REPO / guide).read_text(encoding="utf-8")):
            named |= set(re.findall(r"(?:vprl\.train\.view|vprl view) (runs/quickstart/[\w/.-]+)", span))
    assert named and sorted(named - written) == []
