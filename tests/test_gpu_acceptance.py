"""The GPU acceptance script at toy sizes on a CPU, so it cannot rot between the sessions that have a
GPU: every part runs and its figures come out in the table and the JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_acceptance_runs_at_tiny_sizes_and_reports_every_part(tmp_path):
    out = tmp_path / "acceptance.json"
    command = [sys.executable, "bench/gpu/acceptance.py", "--tiny", "--steps", "2", "--calls", "4", "--json", str(out)]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for heading in ("## 1. tools", "## 2. GRPO steps", "## 3. memory, predicted"):
        assert heading in proc.stdout
    data = json.loads(out.read_text())
    tools = {(r["stack"], r["tool"]) for r in data["tools"] if "speedup" in r}
    assert {("viunit", "detect"), ("viunit", "vqa"), ("vipergpt", "depth")} <= tools
    assert all(r["batched_per_s"] > 0 and r["single_per_s"] > 0 for r in data["tools"] if "speedup" in r)
    grpo = data["grpo"]
    assert len(grpo["steps"]) == 2 and grpo["summed"]["step"] > 0 and grpo["summed"]["execution"] > 0
    assert 0 < grpo["exec_reward_share"] < 1 and "policy (training)" in grpo["predicted"]
