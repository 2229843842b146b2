"""Write constraints-gpu.txt by resolving what a GPU install asks for, without installing anything.

    python bench/gpu/lock_gpu.py [--pip PIP] [--out constraints-gpu.txt]

The resolution is pip's own (`pip install --dry-run --ignore-installed --report`) of
`vprl[cpu,vllm]`, the CPU install's extras plus the vllm extra, run by the newest pip in a
throwaway venv (or `--pip`), with pip's configuration files and its find-links, extra-index and
constraint variables ignored: the lock is PyPI's answer, not this machine's. It starts from the CPU
lock (constraints-cpu.txt) so that the GPU set stays the tested one wherever it can; a CPU pin that
the vllm extra rules out is released and pip picks its version, and the file lists every released
pin. The torch that vLLM pins is the CUDA build: pip reads its metadata, it installs nothing.
It resolves for this interpreter's Python and platform, which the file's header names.

`make lock` runs it after writing the CPU lock; it needs PyPI.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXTRAS = "cpu,vllm"
# The pins the vllm extra itself sets (pyproject.toml): they replace the CPU lock's.
OWN_PINS = ("transformers", "huggingface-hub", "vllm")
CONFLICT = re.compile(r"The user requested \(constraint\) ([A-Za-z0-9_.\-]+)==")
MAX_ROUNDS = 20  # each round releases at least one pin; the CPU lock has far fewer conflicts
MACHINE_SETTINGS = (
    "PIP_FIND_LINKS",
    "PIP_EXTRA_INDEX_URL",
    "PIP_CONSTRAINT",
    "PIP_NO_INDEX",
    "PIP_REQUIRE_VIRTUALENV",
)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#") and "==" in line:
            name, version = line.split("==", 1)
            pins[canonical(name)] = version.strip()
    return pins


def resolve(pip: list[str], constraints: dict[str, str], workdir: Path) -> tuple[dict[str, str] | None, str]:
    """pip's resolution under `constraints`: {name: version}, or None and pip's output."""
    cfile, report = workdir / "constraints.txt", workdir / "report.json"
    cfile.write_text("".join(f"{n}=={v}\n" for n, v in sorted(constraints.items())), encoding="utf-8")
    command = [*pip, "install", "--dry-run", "--ignore-installed", "--report", str(report)]
    env = {k: v for k, v in os.environ.items() if k not in MACHINE_SETTINGS} | {"PIP_CONFIG_FILE": os.devnull}
    done = subprocess.run([*command, "-c", str(cfile), f"{REPO}[{EXTRAS}]"], capture_output=True, text=True, env=env)
    if done.returncode:
        return None, done.stdout + done.stderr
    installs = json.loads(report.read_text(encoding="utf-8"))["install"]
    return {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}, ""


def own_pins() -> dict[str, str]:
    import tomllib

    from packaging.requirements import Requirement

    data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    out = {}
    for text in data["project"]["optional-dependencies"]["vllm"]:
        req = Requirement(text)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if exact:
            out[canonical(req.name)] = exact[0]
    return out


def throwaway_pip(folder: Path) -> list[str]:
    """The newest pip in a new venv: older ones download whole wheels (vLLM's is 320 MB, CUDA torch's
    more) where PyPI serves their metadata alone."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    pip = [str(folder / "bin" / "python"), "-m", "pip"]
    env = os.environ | {"PIP_CONFIG_FILE": os.devnull}
    subprocess.run([*pip, "install", "--quiet", "--upgrade", "pip"], check=True, env=env)
    return pip


def lock(pip: list[str]) -> tuple[dict[str, str], list[str]]:
    cpu = {n: v for n, v in read_pins(REPO / "constraints-cpu.txt").items() if n not in OWN_PINS}
    constraints = {**cpu, **own_pins()}
    released: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(MAX_ROUNDS):
            resolved, output = resolve(pip, constraints, Path(tmp))
            if resolved is not None:
                return resolved, released
            conflicting = sorted({canonical(m) for m in CONFLICT.findall(output)} & set(cpu) - set(released))
            if not conflicting:
                raise SystemExit(f"pip cannot resolve vprl[{EXTRAS}] and names no CPU pin to release:\n{output}")
            for name in conflicting:
                constraints.pop(name)
                released.append(f"{name}=={cpu[name]}")
    raise SystemExit(f"no resolution after releasing {len(released)} CPU pins: {released}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pip", help="a pip to resolve with (default: the newest, in a throwaway venv)")
    parser.add_argument("--out", default=str(REPO / "constraints-gpu.txt"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        resolved, released = lock(args.pip.split() if args.pip else throwaway_pip(Path(tmp) / "venv"))
    resolved.pop("vprl", None)
    header = [
        f"# The tested GPU set: pip's resolution of vprl[{EXTRAS}] from the CPU lock (bench/gpu/lock_gpu.py,",
        "# run by make lock); install with -c constraints-gpu.txt. CPU pins the vllm extra rules out,",
        "# released for pip to choose: " + (", ".join(released) or "none"),
        f"# Resolved for CPython {platform.python_version()} on {platform.system()} {platform.machine()}.",
    ]
    body = sorted((f"{n}=={v}" for n, v in resolved.items()), key=str.lower)
    Path(args.out).write_text("\n".join(header + body) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(body)} pins, {len(released)} CPU pins released")


if __name__ == "__main__":
    main()
