"""The tool service (Ray Serve) against tools in-process, side by side in one run.

    python bench/serve.py [--calls 64] [--questions 40]

1. Throughput of a batched tool (tiny random BLIP-2 `vqa`, batch 8): in-process through the tool
   host, served with 1 replica and with 2 replicas, all calls submitted at once; the mean batch each
   replica saw.
2. The share of tool calls answered from a cache on a GRPO-like workload (questions x 8 samples, over
   `--epochs` epochs), with the samples of each group split between two clients as trl splits them
   between two ranks: one process running everything (the reference), each client in-process with its
   own cache, and both clients on one served stack (the shapes tools) whose cache they share. Goal: at
   least 70 % with two clients.

On a CPU the replicas share the same cores as the client, so throughput says how much the service
costs, not what it gains on GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs  # noqa: E402
from vprl.data.shapes.mutations import mutate  # noqa: E402
from vprl.data.shapes.tasks import load_shapes_tasks  # noqa: E402
from vprl.executor.backends import open_backend  # noqa: E402
from vprl.executor.host import ToolHost  # noqa: E402
from vprl.executor.runner import RunnerConfig, SyncRunner  # noqa: E402
from vprl.executor.serve.deploy import deploy, undeploy  # noqa: E402
from vprl.executor.tools.images import ImageStore  # noqa: E402


def throughput(root: Path, n_calls: int) -> None:
    from bench.tools import make_calls
    from tests import tiny_models

    model = tiny_models.build("blip2_t5", root / "models")
    stack = root / "vqa.yaml"
    print(f"\n== batched tool: tiny BLIP-2 vqa, {n_calls} calls at once, batch 8 ==")
    print(f"{'where':<22} {'calls/s':>9} {'mean batch':>11}")
    for replicas in (0, 1, 2):
        config = {"backend": "hf", "device": "cpu", "dtype": "float32", "vqa": {"model": model, "max_batch_size": 8}}
        config["serve"] = {"app_prefix": f"bench{replicas}-", "vqa": {"num_replicas": max(replicas, 1)}}
        stack.write_text(yaml.safe_dump(config))
        settings = deploy(stack) if replicas else None
        backend = open_backend(stack, ImageStore(), service="auto" if replicas else None)
        host = ToolHost(backend, max_batch_size=8)
        calls = make_calls("vqa", n_calls, host.images, (96, 128))

        async def go(host=host, calls=calls, replicas=replicas):
            # warm: every replica loads its model on its first batch
            await asyncio.gather(*(host.call(c) for c in calls[: 16 * max(replicas, 1)]))
            host._cache.clear()
            start = time.perf_counter()
            await asyncio.gather(*(host.call(c) for c in calls))
            return time.perf_counter() - start

        host._cache.clear()
        wall = asyncio.run(go())
        if replicas:
            stats = [backend.handles["vqa"].stats.remote().result() for _ in range(4 * replicas)]
            means = {s["pid"]: s["mean_batch"] for s in stats}
            batch = ", ".join(f"{m:.1f}" for m in means.values())
            undeploy(settings)
        else:
            batch = f"{host.metrics()['mean_batch_size']:.1f}"
        where = "in-process" if not replicas else f"served, {replicas} replica{'s' * (replicas > 1)}"
        print(f"{where:<22} {n_calls / wall:>9.1f} {batch:>11}")
        host.close()


def grpo_programs(root: Path, n_questions: int, n_epochs: int) -> list[list[tuple]]:
    """Epochs of `n_questions` x 8 samples: each sample is the gold program or one of its mutants, the
    policy repeating itself often (identical programs) as a sampled policy does."""
    build_dataset(BuildConfig(out=str(root), train=n_questions, val=2, winoground=0, sugarcrepe=0, refcoco=0, seed=7))
    examples = load_shapes_tasks(root, ["train"])["train"][:n_questions]
    gold = load_gold_programs(root)["vqa"]
    rng = random.Random(3)
    epochs = []
    for _ in range(n_epochs):
        jobs = []
        for example in examples:
            pool = [gold[example.query]] + [m.program for m in mutate(gold[example.query])]
            for k in range(8):
                src = pool[min(int(rng.expovariate(1.2)), len(pool) - 1)]
                jobs.append((example, src if rng.random() < 0.5 else src + f"# sample {k}\n"))
        epochs.append(jobs)
    return epochs


def cache_share(root: Path, n_questions: int, n_epochs: int) -> None:
    epochs = grpo_programs(root / "world", n_questions, n_epochs)
    stack = root / "shapes.yaml"
    stack.write_text(yaml.safe_dump({"backend": "shapes", "serve": {"app_prefix": "bench-grpo-"}}))
    print(f"\n== GRPO-like workload: {n_questions} questions x 8 samples x {n_epochs} epochs (shapes tools) ==")
    for clients, served in ((1, False), (2, False), (2, True)):
        settings = deploy(stack) if served else None
        hosts = [
            ToolHost(open_backend(stack, ImageStore(), service="auto" if served else None)) for _ in range(clients)
        ]
        before = _service_hits(hosts[0].backend) if served else 0
        runners = [SyncRunner(host, RunnerConfig(slots=2 // clients, timeout_s=10.0)) for host in hosts]
        for jobs in epochs:
            threads = [threading.Thread(target=runners[c].run, args=(jobs[c::clients],)) for c in range(clients)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        calls = sum(h.metrics()["calls"] for h in hosts)
        local = sum(h.metrics()["cache_hits"] + h.metrics()["inflight_hits"] for h in hosts)
        shared = (_service_hits(hosts[0].backend) - before) if served else 0
        where = (
            {1: "one process, all samples", 2: "2 clients, each in-process"}[clients]
            if not served
            else ("2 clients, one served stack")
        )
        print(
            f"{where:<28} tool calls {calls:>4}, from the clients' caches {local:>4}, from the service's {shared:>3}: "
            f"{100 * (local + shared) / calls:.0f}% cached"
        )
        for runner in runners:
            runner.close()
        for host in hosts:
            host.close()
        if settings:
            undeploy(settings)


def _service_hits(backend) -> int:
    """Calls the service answered without its model: from its cache, or merged with an identical call."""
    return sum(stats["cache_hits"] + stats["merged"] for stats in backend.metrics().values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=64)
    p.add_argument("--questions", type=int, default=40)
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    import ray

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            throughput(Path(tmp), args.calls)
            cache_share(Path(tmp), args.questions, args.epochs)
    finally:
        from ray import serve

        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
