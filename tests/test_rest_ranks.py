"""ReST on several processes (issue #24, fault 5): the main process used to sample and execute every
program while the others waited in a collective, long enough on a real dataset to pass `ddp_timeout`.
Now each process samples and scores its shard of the questions, the scored rows are gathered, every
process trains on the same kept set, and the main process alone writes the rollouts (each row once).

Two CPU processes over gloo (`accelerate launch --multi_gpu --num_processes 2`, as the other
two-process tests), each running tests/rest_ranks_worker.py: the real loop, executor, oracle tools,
correctness reward and SFT step, with `PoolGenerator` handing out real program bodies.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

from rest_helpers import build_world, prompt_for

from vprl.train.rest.iterations import adapter_dir, read_summary
from vprl.train.rest.ranks import Ranks, gather_timeout_s
from vprl.train.rollouts.log import RolloutLog

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A port nobody listens on now (a fixed one may be taken by another run on this machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_each_process_samples_its_shard_and_all_train_on_the_same_kept_set(tmp_path):
    world_root, examples, _ = build_world(tmp_path / "world")
    out = tmp_path / "out"
    out.mkdir()
    accelerate = str(Path(sys.executable).parent / "accelerate")
    command = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    command += ["--mixed_precision", "no", "--dynamo_backend", "no"]
    command += ["--main_process_port", str(free_port())]
    command += [str(REPO / "tests" / "rest_ranks_worker.py"), str(world_root), str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]

    ranks = [json.loads((out / f"rank-{i}.json").read_text()) for i in (0, 1)]
    prompts = [prompt_for(e.query) for e in examples]
    # every other question each: together all of them, none twice
    assert [r["sampled"] for r in ranks] == [[prompts[0], prompts[2]], [prompts[1]]]
    # both trained on the same SFT examples (the gold programs of questions 0 and 1), so DDP kept
    # their adapters equal
    assert ranks[0]["trained"] == ranks[1]["trained"] and len(ranks[0]["trained"][0]) == 2
    assert abs(ranks[0]["lora_sum"] - ranks[1]["lora_sum"]) < 1e-6

    run = out / "run"
    rows = RolloutLog.in_run(run).read()
    assert len(rows) == 12 and Counter(r.example_id for r in rows) == {e.id: 4 for e in examples}
    assert [r.example_id for r in rows[::4]] == [e.id for e in examples]  # in question order, as one process
    summary = read_summary(run, 0)
    assert (summary.samples, summary.rewarded, summary.kept, summary.kept_queries) == (12, 3, 2, 2)
    kept = [json.loads(line) for line in (run / "iterations/iter-0/kept.jsonl").read_text().splitlines()]
    assert [(k["example_id"], k["total"]) for k in kept] == [(examples[0].id, 1.0), (examples[1].id, 1.0)]
    assert (adapter_dir(run, 0) / "adapter_model.safetensors").is_file()


def test_gather_timeout_covers_the_slowest_shard_beyond_ddp_timeout():
    """The wait for the other shards scales with a shard's programs and the executor's deadlines: 1000
    questions x 8 samples on 8 processes, 16 slots, 120 s per program is 63 rounds of 120 s on top of
    the 30 minutes of `ddp_timeout`."""

    class Runner:
        class runner:
            class config:
                slots, timeout_s = 16, 120.0

    assert gather_timeout_s(1800, 1000, 8, 8, Runner) == 1800 + 63 * 120.0
    assert Ranks(1, 8).shard(20) == [1, 9, 17] and Ranks(0, 1).gather("rows") == ["rows"]
