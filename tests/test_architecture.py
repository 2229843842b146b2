"""The shape of the code: imports point one way and never in a circle, the entry scripts shadow no
installed package, and the project stands alone (no file outside it is cited, no machine path)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("data", "executor", "rewards", "train")  # the layers, each a subpackage of vprl
# Each layer may import itself and the layers after it: train -> rewards -> executor -> data.
LAYERS = ("train", "rewards", "executor", "data")


def _modules(with_bench: bool = False) -> dict[str, Path]:
    """Module name -> file, for the layers and, `with_bench`, the benchmarks (`bench.X`)."""
    out = {}
    folders = [REPO / "vprl" / package for package in PACKAGES] + ([REPO / "bench"] if with_bench else [])
    for folder in folders:
        for path in folder.rglob("*.py"):
            if "wheelhouse" in path.relative_to(REPO).parts:  # downloaded wheels, not ours
                continue
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def import_graph(with_bench: bool = True) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, counting every import statement wherever it stands
    (inside functions and under TYPE_CHECKING too: a circle broken only by a lazy import is still one)."""
    modules = _modules(with_bench)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {_resolve(alias.name, modules) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
                source = ".".join(p for p in (base, node.module or "") if p)
                # `from pkg import submodule` imports the submodule, `from mod import name` the module
                edges |= {_resolve(f"{source}.{alias.name}", modules) for alias in node.names}
        graph[module] = edges - {None, module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_circle_through_a_lazy_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_imports_point_one_way():
    """Each layer imports itself and the layers after it; bench/ stands above them all, and nothing of
    vprl imports it."""
    wrong = []
    for module, targets in import_graph().items():
        if module.startswith("bench."):
            continue
        allowed = LAYERS[LAYERS.index(module.split(".")[1]) :]
        wrong += [
            f"{module} -> {t}" for t in sorted(targets) if t.startswith("bench.") or t.split(".")[1] not in allowed
        ]
    assert wrong == []


def test_the_stages_that_consume_a_run_never_import_the_trainers():
    """#36 item 5 (docs/architecture.md): evaluation, view, export, ACE and the bootstrap live under
    `vprl.train` for its policy side (policy, prompts, sampling, rollouts, runs), never for its trainers."""
    consumers = ("evaluation", "view", "export", "ace", "bootstrap")
    trainers = ("vprl.train.online", "vprl.train.rest", "vprl.train.rl")
    wrong = [
        f"{module} -> {t}"
        for module, targets in import_graph().items()
        if module.split(".")[:3] in (["vprl", "train", c] for c in consumers)
        for t in sorted(targets)
        if t.startswith(trainers)
    ]
    assert wrong == []


def test_item6_the_import_graph_covers_bench():
    graph = import_graph()
    assert {"bench.transfer", "bench.transfer_cells", "bench.gpu.acceptance"} <= set(graph)
    assert "bench.transfer_cells" in graph["bench.transfer"]  # `from bench.transfer_cells import ...` is an edge
    assert "vprl.train.rl" in graph["bench.transfer"]  # and so is a lazy `from vprl.train.rl import main`


def test_entry_scripts_shadow_no_installed_package():
    """`accelerate launch vprl/train/rl.py` (or `python bench/X.py`) puts the script's folder first on
    sys.path: no name there may be a standard-library module, a module an installed distribution
    provides, or one of our own packages."""
    installed = set(sys.stdlib_module_names) | set(metadata.packages_distributions()) | {"vprl", *PACKAGES}
    for folder in ("vprl/train", "bench", "train"):
        here = REPO / folder
        names = {p.stem for p in here.glob("*.py")} | {p.name for p in here.iterdir() if p.is_dir()}
        names -= {"__init__", "__pycache__"}
        assert names and sorted(names & installed) == [], folder


def test_entry_scripts_need_no_sys_path_edits():
    """Commands run from the installed package: none rewrites sys.path to find its own modules."""
    entries = [
        p
        for package in PACKAGES
        for p in (REPO / "vprl" / package).rglob("*.py")
        if p.name == "__main__.py" or '__name__ == "__main__"' in p.read_text(encoding="utf-8")
    ]
    offenders = [
        str(p.relative_to(REPO))
        for p in entries
        if re.search(r"sys\.path\s*(\[|\.insert|\.append)", p.read_text(encoding="utf-8"))
    ]
    assert len(entries) >= 5 and offenders == []


# Anything that points outside the repository: the development machine's folders, the documents the
# project was built from, absolute home paths.
OUTSIDE = re.compile(
    r"\.\./shared|\bshared/(seeds|research|DESIGN)|\bDIGEST\b|(?i:\bthe (digest|seeds)\b)|/work/|/home/\w|/Users/\w|\.library/"
)
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".json", ".jsonl", ".sh", ""}


def _tracked_text_files() -> list[Path]:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    out = []
    for name in files:
        path = REPO / name
        if path.suffix in TEXT_SUFFIXES and path.is_file() and path.stat().st_size < 2_000_000:
            out.append(path)
    return out


def test_no_reference_to_files_outside_the_project():
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    hits = []
    for path in _tracked_text_files():
        if path == Path(__file__):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}")
    assert hits == []


CITATION = re.compile(r"\[([USVE])\]")


def test_every_citation_key_is_defined_in_the_references():
    references = (REPO / "docs" / "references.md").read_text(encoding="utf-8")
    defined = set(re.findall(r"^\| \*\*\[([A-Z])\]\*\* \|", references, flags=re.M))
    used = set()
    for folder in ("vprl", "configs"):
        for path in (REPO / folder).rglob("*"):
            if path.suffix in (".py", ".yaml"):
                used |= set(CITATION.findall(path.read_text(encoding="utf-8")))
    assert used and used <= defined, f"cited but not defined in docs/references.md: {sorted(used - defined)}"


def test_the_checkout_is_found_in_one_place():
    """Only `vprl.paths` finds the repository from `__file__`: a module counting `parents[N]` from where
    it lives silently looked for train/configs/ once it moved one folder deeper, and assumed a checkout
    that a non-editable install does not have."""
    from vprl import paths

    counting = re.compile(r"Path\(__file__\)\.resolve\(\)\.parents\[")
    offenders = [module for module, path in _modules().items() if counting.search(path.read_text(encoding="utf-8"))]
    assert offenders == []
    assert paths.PACKAGE == REPO / "vprl" and paths.IMPORT_ROOT == REPO and paths.CHECKOUT == REPO
    assert paths.checkout_file("configs/quickstart.yaml").is_file()


def test_the_paths_module_imports_the_standard_library_alone():
    """The sandbox's supervisor imports it while it boots, before anything else of ours is safe to import."""
    tree = ast.parse((REPO / "vprl" / "paths.py").read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported and {name.split(".")[0] for name in imported} <= set(sys.stdlib_module_names) | {"__future__"}


def test_one_top_level_name():
    """A user's project with its own `data`, `train`, `rewards` or `executor` packages can install
    vprl: the distribution installs `vprl` alone, and no module of ours imports a layer by its bare
    name."""
    import tomllib

    found = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"]
    assert found["find"]["include"] == ["vprl*"]
    bare = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            bare += [f"{module}: {n}" for n in names if n.split(".")[0] in PACKAGES]
    assert bare == []
