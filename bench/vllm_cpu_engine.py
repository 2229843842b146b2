"""vprl's vLLM paths on the real engine (vLLM's CPU build, `.venv/vllm`), measured: per path, the
importance-sampling ratios trl logged at each step, the largest difference between the engine's and
the trained model's log-probabilities after a weight sync, and the time the path took.

    .venv/bin/python bench/vllm_cpu_engine.py [--out runs/bench_vllm_cpu]

It runs `tests/vllm_cpu_driver.py` (what tests/test_vllm_cpu_engine.py judges) in the engine's
environment and prints one table; docs/benchmarks.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_driver(out: Path, python: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS=str(os.cpu_count() or 2))
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="offline")
    with open(out / "driver.log", "w") as log:
        subprocess.run(
            [str(python), str(REPO / "tests/vllm_cpu_driver.py"), str(out)], env=env, stdout=log, stderr=log
        )
    return json.loads((out / "results.json").read_text())


def ratios(entry: dict) -> str:
    steps = entry.get("steps") or []
    cells = []
    for step in steps:
        if "sampling/importance_sampling_ratio/min" not in step:
            return "(no correction in trl's RLOO)"
        lo, mean, hi = (step[f"sampling/importance_sampling_ratio/{k}"] for k in ("min", "mean", "max"))
        cells.append(f"{lo:.6f} / {mean:.6f} / {hi:.6f}")
    return "; ".join(cells) or "-"


def sync_difference(entry: dict) -> str:
    if entry.get("sync_logp_difference"):
        return f"{max(entry['sync_logp_difference']):.1e} ({len(entry['sync_logp_difference'])} syncs)"
    if entry.get("served"):
        return f"{max(s['difference'] for s in entry['served']):.1e} ({len(entry['served'])} adapters)"
    if "logp_difference" in entry:
        return f"{entry['logp_difference']:.1e} (served)"
    return "-"


def table(results: dict) -> str:
    rows = ["| path | importance ratio min / mean / max, per step | engine vs model log-prob, max | seconds |"]
    rows.append("|---|---|---|---|")
    for name, entry in results.items():
        if name == "assets":
            continue
        if "error" in entry:
            rows.append(f"| {name} | failed: {entry['error'].splitlines()[0][:80]} | | {entry['seconds']} |")
            continue
        rows.append(f"| {name} | {ratios(entry)} | {sync_difference(entry)} | {entry['seconds']} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--python", type=Path, default=Path(sys.prefix) / "vllm" / "bin" / "python")
    args = parser.parse_args()
    if not args.python.is_file():
        parser.error(f"--python: {args.python} does not exist; `make test` builds the engine's environment")
    start = time.monotonic()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        results = run_driver(args.out, args.python)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            results = run_driver(Path(tmp), args.python)
    print(table(results))
    print(f"\n{time.monotonic() - start:.0f} s in all on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
