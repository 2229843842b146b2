"""The install's pins agree with each other and with the code (issue #24, fault 2): `pip install -e
".[vllm]"` once allowed vLLM 0.31.0, which requires transformers<5.18, while the recipe's trainer
arguments used `activation_checkpointing`, which transformers has only from 5.23 on, so `import
vprl.train.rl` raised KeyError. The pins are read from pyproject.toml, vLLM's requirements from its
releases' metadata (recorded below), trl's from the installed trl; the code runs under the
transformers the extra lands on (installed beside the venv by `make setup`)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from side_transformers import REPO, side_env, side_requires, side_version

# What each vLLM release requires of transformers, read from its metadata on PyPI with
# `pip install --dry-run --ignore-installed --no-deps --report r.json vllm==V`. A vllm extra that
# pins a release not listed here fails until its line is added from the same command.
VLLM_REQUIRES = {
    "0.28.0": "transformers>=5.5.3",
    "0.29.0": "transformers>=5.10.4",
    "0.30.0": "transformers>=5.10.4",
    "0.31.0": "transformers>=5.10.4,<5.18.0",
    "0.32.0": "transformers>=5.16.1,<5.20.0",
    "0.33.0": "transformers>=5.16.1,<5.21.0",
}


def extra(name: str) -> dict[str, Requirement]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    return {r.name: r for r in map(Requirement, data["project"]["optional-dependencies"][name])}


def pinned_vllm() -> str:
    spec = extra("vllm")["vllm"].specifier
    pins = [s.version for s in spec if s.operator == "=="]
    assert len(pins) == 1 and len(spec) == 1, f"pyproject.toml: the vllm extra must pin one vLLM release (vllm==X), got {spec}"  # fmt: skip
    assert pins[0] in VLLM_REQUIRES, f"pyproject.toml: vllm=={pins[0]}: record its transformers requirement in VLLM_REQUIRES"  # fmt: skip
    return pins[0]


def transformers_specs() -> dict[str, SpecifierSet]:
    """Every constraint on transformers that `pip install -e ".[vllm,training]"` must meet."""
    return {
        "the training extra": extra("training")["transformers"].specifier,
        "the vllm extra": extra("vllm")["transformers"].specifier,
        f"vllm=={pinned_vllm()}": Requirement(VLLM_REQUIRES[pinned_vllm()]).specifier,
    }


def test_the_vllm_extra_pins_a_vllm_that_trl_accepts():
    trl_wants = [Requirement(r) for r in importlib.metadata.requires("trl") if r.startswith("vllm")]
    assert trl_wants, "the installed trl declares no vllm extra"
    for want in trl_wants:
        assert Version(pinned_vllm()) in want.specifier, f"vllm=={pinned_vllm()} is outside trl's {want}"


def test_the_vllm_extra_lands_on_the_transformers_the_tests_run_under():
    """The side folder's transformers meets every constraint of the vllm install (so the constraints
    can be met at all), and the packages beside it meet transformers' own requirements."""
    version = Version(side_version("transformers"))
    for where, spec in transformers_specs().items():
        assert version in spec, f"transformers {version} (Makefile SIDE_TRANSFORMERS) is outside {where}'s {spec}"
    hub = Version(side_version("huggingface_hub"))
    for line in side_requires("transformers"):
        req = Requirement(line)
        if req.marker is not None:
            continue
        installed = hub if req.name == "huggingface-hub" else _installed(req.name)
        if installed is not None:
            assert installed in req.specifier, f"transformers {version} requires {req}, the tests have {installed}"


def _installed(name: str) -> Version | None:
    try:
        return Version(importlib.metadata.version(name))
    except importlib.metadata.PackageNotFoundError:
        return None


CHECK = """
import json, transformers
import vprl.train.rl, vprl.train.prepare_unit_tests
from vprl.train.recipe.layout import policy_component
from vprl.train.recipe.rl_config import parse_rl_config
cfg = parse_rl_config(["--config", "configs/grpo_codellama_gqa_correctness.yaml", "--output_dir", "/tmp/unused"])
off = parse_rl_config(["--output_dir", "/tmp/unused", "--gradient_checkpointing", "false"])
from trl import SFTConfig
from vprl.train.recipe.trainer_args import checkpointing
sft = SFTConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **checkpointing(False))
print(json.dumps({"version": transformers.__version__, "on": [cfg.training.activation_checkpointing,
      cfg.training.gradient_checkpointing], "off": [off.training.activation_checkpointing,
      off.training.gradient_checkpointing], "flat": cfg.to_flat()["activation_checkpointing"],
      "trl_sft": sft.gradient_checkpointing}))
"""


def test_train_rl_imports_under_the_transformers_of_the_vllm_extra():
    """The fault itself: `KeyError: 'activation_checkpointing'` from vprl/train/recipe/trainer_args.py."""
    proc = subprocess.run([sys.executable, "-c", CHECK], cwd=REPO, env=side_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["version"] == side_version("transformers")
    # The recipe's key reaches what this transformers reads (`gradient_checkpointing` before 5.23).
    assert seen["on"] == [True, True] and seen["off"] == [False, False] and seen["flat"] is True
    # trl's own configs (the bootstrap's SFTConfig) take the switch under the name this version knows.
    assert seen["trl_sft"] is False


def test_grpo_trains_a_step_under_the_transformers_of_the_vllm_extra(tmp_path):
    """trl 1.16's GRPO trainer, built by the entry point's own `build_trainer`, trains a step."""
    command = [sys.executable, "bench/gpu/acceptance.py", "--tiny", "--steps", "1", "--out", str(tmp_path),
               "--parts", "world,policy,tools,grpo_trl"]  # fmt: skip
    proc = subprocess.run(command, cwd=REPO, env=side_env(), capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert next(r for r in rows if r["what"] == "versions")["transformers"] == side_version("transformers")
    outcome = next(r for r in rows if r["part"] == "grpo_trl" and r["what"] == "status")
    assert outcome["status"] == "ok", outcome.get("traceback") or outcome
    step = next(r for r in rows if r["part"] == "grpo_trl" and r["what"] == "step")
    assert step["step"] > 0 and step["generation"] > 0 and step["execution"] > 0
    assert proc.returncode == 0, proc.stderr[-3000:]


def _lock(name: str) -> dict[str, str]:
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (REPO / name).read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{name}: {line!r} is not a pin"
            pins[canonicalize_name(req.name)] = spec.version
    return pins


def test_the_venv_is_the_lock():
    """#29 item 1: a fresh clone installs what CI tested. Every package of the venv is pinned in
    constraints-cpu.txt at the version installed (`make lock` refreshes it)."""
    from packaging.utils import canonicalize_name

    lock = _lock("constraints-cpu.txt")
    # Listed by a fresh interpreter: tests in this process may have put other folders on sys.path.
    listing = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m, json; "
         "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions() if d.metadata['Name']}))"],
        capture_output=True, text=True, check=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # fmt: skip
    own_tools = ("vprl", "pip", "setuptools", "wheel")  # the package itself and the venv's own tools
    installed = {
        canonicalize_name(name): version
        for name, version in json.loads(listing.stdout).items()
        if canonicalize_name(name) not in own_tools
    }
    unpinned = sorted(set(installed) - set(lock))
    assert not unpinned, f"installed but not in constraints-cpu.txt (run make lock): {unpinned}"
    drift = {n: (installed[n], lock[n]) for n in installed if Version(installed[n]).public != Version(lock[n]).public}
    assert not drift, f"installed versions differ from constraints-cpu.txt: {drift}"


def test_the_gpu_lock_is_the_cpu_lock_with_the_vllm_extra():
    cpu, gpu = _lock("constraints-cpu.txt"), _lock("constraints-gpu.txt")
    assert gpu["vllm"] == pinned_vllm()
    assert Version(gpu["transformers"]) == Version(side_version("transformers"))
    assert Version(gpu["huggingface-hub"]) == Version(side_version("huggingface_hub"))
    for where, spec in transformers_specs().items():
        assert Version(gpu["transformers"]) in spec, (
            f"constraints-gpu.txt: transformers {gpu['transformers']} vs {where}"
        )
    differ = {n for n in cpu if gpu.get(n) != cpu[n]}
    assert differ <= {"transformers", "huggingface-hub"} | set(_released()), differ


def _released() -> dict[str, str]:
    """The CPU pins constraints-gpu.txt's header says the resolution released."""
    text = (REPO / "constraints-gpu.txt").read_text(encoding="utf-8")
    (line,) = [line for line in text.splitlines() if line.startswith("# released for pip to choose:")]
    listed = line.split(":", 1)[1].strip()
    return {} if listed == "none" else dict(item.strip().split("==") for item in listed.split(","))


def vllm_requirements(version: str) -> list[Requirement]:
    """vLLM's published requirements (tests/fixtures/vllm-<version>-requires.txt, from its METADATA)
    that apply to a plain install on the machines the lock is for: Linux x86_64, the lock's Python."""
    lines = (REPO / "tests" / "fixtures" / f"vllm-{version}-requires.txt").read_text(encoding="utf-8").splitlines()
    header = (REPO / "constraints-gpu.txt").read_text(encoding="utf-8")
    python = header.split("# Resolved for CPython ", 1)[1].split(" ", 1)[0]
    where = {"platform_machine": "x86_64", "platform_system": "Linux", "sys_platform": "linux",
             "python_version": ".".join(python.split(".")[:2]), "python_full_version": python, "extra": ""}  # fmt: skip
    reqs = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(where)]


def test_item3_every_gpu_pin_meets_vllms_published_requirements():
    """#34 item 3: constraints-gpu.txt pinned fastapi 0.165.0 where vllm 0.31.0 requires
    fastapi[standard]>=0.133.0,<0.137.0, so the lock could not be installed. Every pin that vLLM
    requires must be inside vLLM's specifier."""
    gpu = _lock("constraints-gpu.txt")
    from packaging.utils import canonicalize_name

    requirements = vllm_requirements(gpu["vllm"])
    assert len(requirements) > 50, "the recorded requirements look truncated"
    outside = {
        str(r): gpu[canonicalize_name(r.name)]
        for r in requirements
        if canonicalize_name(r.name) in gpu
        and not r.specifier.contains(gpu[canonicalize_name(r.name)], prereleases=True)
    }
    assert not outside, f"constraints-gpu.txt pins outside vllm {gpu['vllm']}'s requirements: {outside}"
    missing = sorted(canonicalize_name(r.name) for r in requirements if canonicalize_name(r.name) not in gpu)
    assert not missing, f"constraints-gpu.txt is not a whole resolution: vllm requires {missing}, unpinned"
