"""The GPU acceptance script at toy sizes on a CPU, so it cannot rot between the sessions that have a
GPU: every part runs under the pinned transformers and under the vllm extra's (the GPU machine's),
there without trl and without the sandbox as on that machine; a failed part leaves its traceback
and the next part runs; what was measured is on disk after each part; the budget skips, and says so."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from side_transformers import REPO, side_env, side_version

SCRIPT = "bench/gpu/acceptance.py"
PARTS = ["preflight", "world", "policy", "step", "tools", "execution", "tool_speed", "layout", "vipergpt", "codegemma_step", "grpo_trl"]  # fmt: skip
GPU_MACHINE_LACKS = "trl,datasets,dill,multiprocess,vllm"


def acceptance(out: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, list[dict]]:  # fmt: skip
    command = [sys.executable, SCRIPT, "--tiny", "--calls", "2", "--out", str(out), *args]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    path = out / "results.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return proc, rows


def outcomes(rows: list[dict]) -> dict[str, dict]:
    return {r["part"]: r for r in rows if r["what"] == "status"}


def check_measurements(rows: list[dict]) -> None:
    """Every part's figures are there and plausible."""
    of = {part: [r for r in rows if r["part"] == part and r["what"] != "status"] for part in PARTS}
    step = of["step"]
    assert [r["what"] for r in step] == ["generation", "log-prob pass", "forward/backward"] * 2
    assert all(r["seconds"] > 0 for r in step) and step[0]["new_tokens"] > 0
    runs = of["execution"]
    assert len(runs) == 2 and all(sum(r["statuses"].values()) == r["programs"] > 0 for r in runs)
    assert all(r["tool_calls"] > 0 for r in runs)  # the programs reached the tools
    speeds = {(r["stack"], r["tool"]): r for r in of["tool_speed"] + of["vipergpt"] if r["what"] == "tool"}
    assert {("viunit", "detect"), ("viunit", "verify"), ("viunit", "vqa"), ("viunit", "caption"), ("vipergpt", "depth")} <= set(speeds)  # fmt: skip
    assert all(r["batched_per_s"] > 0 and r["single_per_s"] > 0 for r in speeds.values())
    families = [r["family"] for r in rows if r["part"] in ("tools", "vipergpt") and r["what"] == "built"]
    # Each model built once, though the stacks and parts share them.
    assert sorted(families) == sorted(set(families)) == ["blip2", "clip_224", "clip_336", "depth", "detect"]
    layout = {r["component"]: r for r in of["layout"]}
    assert {"policy (training)", "tool vqa, caption", "per training GPU"} <= set(layout)
    assert all(r["predicted_gib"] > 0 for r in layout.values())
    gemma = of["codegemma_step"]  # #34 item 10: CodeGemma's vocabulary, one step
    assert gemma[0]["what"] == "built" and [r["what"] for r in gemma[1:]] == ["generation", "log-prob pass", "forward/backward"]  # fmt: skip
    assert gemma[1]["new_tokens"] > 0 and all(r["seconds"] > 0 for r in gemma[1:])


def check_markdown(out: Path, rows: list[dict]) -> None:
    md = (out / "results.md").read_text()
    for part in {r["part"] for r in rows}:
        assert f"| {part} |" in md
    rendered = subprocess.run([sys.executable, SCRIPT, "--render", str(out / "results.jsonl")], cwd=REPO,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert rendered.returncode == 0 and rendered.stdout == md


def test_every_part_runs_at_tiny_sizes_under_the_pinned_transformers(tmp_path):
    proc, rows = acceptance(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = outcomes(rows)
    assert list(status) == PARTS
    assert {p: s["status"] for p, s in status.items()} == dict.fromkeys(PARTS, "ok"), rows
    check_measurements(rows)
    trl_steps = [r for r in rows if r["part"] == "grpo_trl" and r["what"] == "step"]
    assert len(trl_steps) == 2 and all(r["step"] > 0 and r["execution"] > 0 for r in trl_steps)
    check_markdown(tmp_path, rows)


def test_every_part_runs_under_the_gpu_machines_transformers_without_trl_or_the_sandbox(tmp_path):
    """As on the GPU machine: transformers 5.17, no trl (nor datasets, ...), sandbox layers missing."""
    proc, rows = acceptance(tmp_path, "--without", GPU_MACHINE_LACKS, "--sandbox", "none", env=side_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert next(r for r in rows if r["what"] == "versions")["transformers"] == side_version("transformers")
    imports = next(r for r in rows if r["what"] == "imports")
    assert imports["trl"].startswith("ModuleNotFoundError") and imports["vprl.train.recipe.layout"].startswith("ok")
    status = outcomes(rows)
    assert list(status) == PARTS
    assert status.pop("grpo_trl")["status"] == "skipped"
    assert {p: s["status"] for p, s in status.items()} == dict.fromkeys(PARTS[:-1], "ok"), rows
    assert next(r for r in rows if r["what"] == "sandbox probe")["note"].startswith("programs run in-process")
    assert {r["sandbox"] for r in rows if r["part"] == "execution" and r["what"] == "programs"} == {"none"}
    check_measurements(rows)
    check_markdown(tmp_path, rows)


def test_a_failed_part_records_its_traceback_and_the_parts_after_it_run(tmp_path):
    proc, rows = acceptance(tmp_path, "--parts", "world,policy,step,tools", "--fail_part", "policy")
    status = outcomes(rows)
    assert status["policy"]["status"] == "failed" and "injected into part policy" in status["policy"]["traceback"]
    # What needs the failed part's policy is skipped, naming it; what does not, runs.
    assert status["step"]["status"] == "skipped" and "part policy" in status["step"]["reason"]
    assert status["tools"]["status"] == "ok" and any(r["part"] == "tools" and r["what"] == "built" for r in rows)
    assert proc.returncode == 1  # a run with a failed part says so, after running the rest
    assert "injected into part policy" in (tmp_path / "results.md").read_text()


def test_the_results_are_on_disk_after_each_part_when_the_run_is_killed(tmp_path):
    proc, rows = acceptance(tmp_path, "--parts", "world,policy,step", "--kill_after", "policy")
    assert proc.returncode == -9
    assert {p: s["status"] for p, s in outcomes(rows).items()} == {"preflight": "ok", "world": "ok", "policy": "ok"}
    assert any(r["part"] == "policy" and r["what"] == "built" for r in rows)
    assert "| policy | ok |" in (tmp_path / "results.md").read_text()


def test_the_budget_skips_what_no_longer_fits_and_the_plan_in_the_help_fits_nine_minutes(tmp_path):
    proc, rows = acceptance(tmp_path, "--budget_s", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = outcomes(rows)
    assert status.pop("preflight")["status"] == "ok"
    assert all(s["status"] == "skipped" and s["reason"].startswith("budget") for s in status.values())
    plan = next(r for r in rows if r["what"] == "run")["plan"]
    assert list(plan) == PARTS and sum(plan.values()) <= 9 * 60
    helptext = subprocess.run([sys.executable, SCRIPT, "--help"], cwd=REPO, capture_output=True, text=True).stdout
    stated = dict(re.findall(r"^\s{4}(\w+)\s+(\d+)\s{2}", helptext, re.MULTILINE))
    assert {k: float(v) for k, v in stated.items()} == plan


def test_item10_the_preflight_records_pillow_and_opencv():
    """#34 item 10: the shapes world and every image processor need Pillow, the shapes tools OpenCV;
    the preflight did not say whether the machine has them."""
    sys.path.insert(0, str(REPO))
    from bench.gpu.preflight import versions

    found = versions([])
    assert found["pillow"] == importlib.metadata.version("pillow")
    assert found["opencv-python-headless"] == importlib.metadata.version("opencv-python-headless")


def _wheelhouse(tmp_path: Path, **env: str) -> list[list[str]]:
    """bench/gpu/wheelhouse.sh with a stand-in pip that records what it was asked to download."""
    tmp_path.mkdir()
    log = tmp_path / "pip.jsonl"
    env.setdefault("WHEELHOUSE", str(tmp_path / "wheelhouse"))
    fake = tmp_path / "pip"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\nopen({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    fake.chmod(0o755)
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # python3: this venv's, which has trl
    proc = subprocess.run(["bash", "bench/gpu/wheelhouse.sh"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": path, "PIP": str(fake), **env})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_item10_the_wheelhouse_fetches_opencv_unless_the_image_has_it(tmp_path):
    """#34 item 10: wheelhouse.sh assumed opencv on the GPU image. It also missed inflect, which
    vprl imports: on the GPU image (which lacks it) the preflight's imports of our entry points failed."""
    wanted = [args[-1].split("==")[0] for args in _wheelhouse(tmp_path / "bare")]
    assert {"opencv-python-headless", "trl", "inflect", "more-itertools", "typeguard"} <= set(wanted)
    image = tmp_path / "image.txt"
    image.write_text("numpy==2.1.0\nopencv-python-headless==4.10.0.84\ninflect==7.5.0\n")
    wanted = [args[-1].split("==")[0] for args in _wheelhouse(tmp_path / "with", IMAGE_PACKAGES=str(image))]
    assert "opencv-python-headless" not in wanted and "inflect" not in wanted and "trl" in wanted


def test_item10_the_docs_parts_example_runs_every_part_it_names(tmp_path):
    """docs/gpu.md's `--parts` example skipped `step` (it needs `world` and `policy`)."""
    text = (REPO / "docs/gpu.md").read_text()
    (example,) = re.findall(r"`--parts ([\w,]+)`", text)
    proc, rows = acceptance(tmp_path, "--parts", example)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p: s["status"] for p, s in outcomes(rows).items()} == dict.fromkeys(
        ["preflight", *example.split(",")], "ok"
    )


def test_every_tool_model_is_built_wholly_on_its_device(tmp_path):
    """On an H200 Grounding DINO's `level_embed` (a legacy `torch.Tensor(...)` constructor, which a
    device context does not reach) stayed on the CPU; it is the model's first parameter, so the tool
    sent its inputs to the CPU and the GPU text encoder refused them. The meta device shows the same
    on a CPU: no parameter may be left off the device asked for."""
    import torch

    sys.path.insert(0, str(REPO))
    from bench.gpu import models

    for family in ("detect", "clip_336", "blip2", "depth"):
        model, _ = models.build(family, "tiny", tmp_path / family, "meta", torch.float32)
        assert {p.device.type for p in model.parameters()} == {"meta"}, family


def test_execution_fails_when_every_program_is_an_infra_error(tmp_path, monkeypatch):
    """On the H200 every program of the execution part ended `infra_error` (the tools failed) and
    the part still said "ok": it now fails, naming the errors."""
    import pytest

    sys.path.insert(0, str(REPO))
    from bench.gpu import stack, step
    from bench.gpu.context import Context
    from bench.gpu.record import Recorder, read

    ctx = Context(rec=Recorder(tmp_path / "out"), scale="tiny", device="cpu", root=tmp_path, calls=2, steps=1,
                  sandbox="full")  # fmt: skip
    step.world(ctx)
    stack.tools(ctx)

    def broken(tool, calls):
        raise RuntimeError("Expected all tensors to be on the same device")

    monkeypatch.setattr(ctx.built["viunit"], "run", broken)
    with pytest.raises(RuntimeError, match="every program ended in infra_error"):
        stack.execution(ctx)
    (row,) = [r for r in read(tmp_path / "out" / "results.jsonl") if r["what"] == "programs"]
    assert set(row["statuses"]) == {"infra_error"} and "same device" in " ".join(row["infra_errors"])
