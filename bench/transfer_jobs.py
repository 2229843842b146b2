"""`bench/transfer.py --jobs N`: the matrix's bootstraps, RL runs and evaluations as N processes at
once, each one `bench/transfer.py --stage ...` call on one seed (and one arm), logging to
`<out>/logs/`. A run is fastest on one core (`--threads 1`), so N cores give nearly N times the
throughput. Each child records what it finished (`runs.jsonl`, `evaluations.jsonl`, one line per
append), so the parent's own pass afterwards trains and evaluates nothing and only summarizes."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "transfer.py"


@dataclass
class Job:
    stage: str  # policy, train or eval
    seed: int
    arms: list[str]
    after: list[Job] = field(default_factory=list)
    process: subprocess.Popen | None = None
    started: float = 0.0

    @property
    def name(self) -> str:
        return f"seed{self.seed}_{self.stage}" + (f"_{self.arms[0]}" if self.stage == "train" else "")


def plan(seeds: list[int], arms: list[str], args: argparse.Namespace, trained: list[dict]) -> list[Job]:
    """Per seed: its policy unless cached, then every arm not yet trained at these steps, then its
    evaluation unless these runs were evaluated under this config already."""
    from bench.transfer_args import policy_config
    from bench.transfer_records import recorded_evaluation
    from vprl.train.bootstrap.fit import cached

    jobs = []
    for seed in seeds:
        policy = [] if cached(policy_config(seed, args)) else [Job("policy", seed, arms)]
        done = {r["arm"] for r in trained if r["seed"] == seed and r["max_steps"] == args.max_steps}
        runs = [Job("train", seed, [arm], after=policy) for arm in arms if arm not in done]
        evaluation = (
            []
            if not runs and recorded_evaluation(seed, arms, args)
            else [Job("eval", seed, arms, after=policy + runs)]
        )
        jobs += [*policy, *runs, *evaluation]
    return jobs


def run_jobs(argv: list[str], seeds: list[int], arms: list[str], args: argparse.Namespace, trained: list[dict]):
    logs = Path(args.out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    waiting, running, finished = plan(seeds, arms, args, trained), [], set()
    failed = None
    while (waiting and failed is None) or running:
        for job in [j for j in running if j.process.poll() is not None]:
            running.remove(job)
            minutes = (time.time() - job.started) / 60
            if job.process.returncode:
                failed = failed or job
                print(f"transfer: {job.name} failed (exit {job.process.returncode}) after {minutes:.1f} min")
            else:
                finished.add(id(job))
                print(f"transfer: {job.name} done in {minutes:.1f} min")
        ready = [j for j in waiting if all(id(a) in finished for a in j.after)]
        while failed is None and ready and len(running) < args.jobs:
            job = ready.pop(0)
            waiting.remove(job)
            command = [
                sys.executable, str(SCRIPT), *argv,
                "--seeds", str(job.seed), "--arms", ",".join(job.arms), "--stage", job.stage, "--jobs", "1",
            ]  # fmt: skip
            with open(logs / f"{job.name}.log", "w", encoding="utf-8") as log:
                job.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            job.started = time.time()
            running.append(job)
            print(f"transfer: {job.name} started (log: {logs / job.name}.log)")
        time.sleep(0.5)
    if failed is not None:
        tail = (logs / f"{failed.name}.log").read_text(errors="replace").splitlines()[-15:]
        sys.exit("\n".join([f"transfer: {failed.name} failed; the end of {logs / failed.name}.log:", *tail]))
