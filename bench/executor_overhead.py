"""Executor benchmark: sandbox vs in-process, the tool cache on a GRPO-like workload, and batched
vs one-at-a-time calls to a tiny neural tool. Prints figures; asserts nothing.

    python bench/executor_overhead.py [--programs 1500] [--questions 40] [--slots 2] [--modes full,restricted]

`--modes` picks the sandboxes compared with in-process: "full" (namespaces) and "restricted" (none;
docs/design-notes.md#the-sandbox-without-namespaces). Run as root, "restricted" has chroot and a uid per
slot; run without capabilities (as a cluster user) it has Landlock instead and the uid of the run.

Targets (2 slots, 2 cores, every isolation layer on): >= 3,000 trivial programs/min, median sandbox
overhead <= 5 ms per program, >= half of the tool calls served from cache in the GRPO-like run.
The overhead is printed three ways: amortized over a batch, per program when all are submitted at
once (which includes queueing for the cores), and per program submitted alone.
Wall-clock figures need a machine to ourselves; the CPU-per-program figure does not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vprl.data.boxes import box_to_top_left  # noqa: E402
from vprl.data.records import Example  # noqa: E402
from vprl.executor.host import ToolHost  # noqa: E402
from vprl.executor.runner import RunnerConfig, SyncRunner  # noqa: E402
from vprl.executor.tools.base import ToolBackend  # noqa: E402
from vprl.executor.tools.calls import ToolCall  # noqa: E402
from vprl.executor.tools.images import ImageStore  # noqa: E402
from vprl.executor.tools.oracle import OracleBackend  # noqa: E402

COLORS = ["red", "green", "blue", "yellow", "black", "white"]
NAMES = ["cat", "dog", "ball", "cup", "car"]
TEMPLATES = [
    "def execute_command(image):\n    return ImagePatch(image).find('{a}')[0].simple_query('what color is the {a}?') if ImagePatch(image).find('{a}') else 'no'\n",
    "def execute_command(image):\n    return bool_to_yesno(ImagePatch(image).exists('{a}'))\n",
    "def execute_command(image):\n    return str(len(ImagePatch(image).find('{a}')))\n",
    "def execute_command(image):\n    p = ImagePatch(image)\n    return 'yes' if p.exists('{a}') and p.exists('{b}') else 'no'\n",
    "def execute_command(image):\n    xs = ImagePatch(image).find('{a}')\n    return xs[0].verify_property('{a}', 'red') if xs else False\n",
]


def make_world(root: Path, n_images: int, seed: int = 0):
    rng = random.Random(seed)
    scenes, examples = {}, []
    for i in range(n_images):
        objects = {}
        for j in range(rng.randint(2, 5)):
            x, y = rng.randint(0, 100), rng.randint(0, 70)
            objects[str(j)] = {
                "name": rng.choice(NAMES),
                "x": x,
                "y": y,
                "w": 20,
                "h": 20,
                "attributes": [rng.choice(COLORS)],
                "relations": [],
            }
        scenes[f"img{i}"] = {"width": 128, "height": 96, "objects": objects}
        path = root / f"img{i}.png"
        Image.fromarray(np.full((96, 128, 3), i % 255, np.uint8)).save(path)
        examples.append(Example(f"q{i}", "gqa", "vqa", "question", str(path), answers=("x",)))
    return scenes, examples


class SlowOracle(OracleBackend):
    """The oracle with a model-like cost: 3 ms per batch plus 1 ms per call."""

    def run(self, tool, calls):
        time.sleep(0.003 + 0.001 * len(calls))
        return super().run(tool, calls)


def process_tree_stat(pid: int) -> tuple[float, int, int]:
    """CPU seconds of a process and of the children it has reaped (the supervisor and its sandboxes),
    and the minor page faults of each side."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    cpu = sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return cpu, int(fields[7]), int(fields[8])


def pct(values, q):
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)]


def bench_sandbox_vs_inprocess(
    scenes, examples, n_programs: int, slots: int, spawn: str = "clone", modes: tuple[str, ...] = ("full",)
) -> None:
    trivial = [
        (examples[i % len(examples)], f"def execute_command(image):\n    return {i}\n") for i in range(n_programs)
    ]
    rng = random.Random(1)
    normal = [
        (examples[i % len(examples)], TEMPLATES[i % 3].format(a=rng.choice(NAMES), b=rng.choice(NAMES)) + f"# {i}\n")
        for i in range(min(n_programs, 400))
    ]
    # Programs not run before: the runner answers a program it has run on an example from its cache.
    one_by_one = [
        (examples[i % len(examples)], f"def execute_command(image):\n    return {-i}\n") for i in range(1, 201)
    ]
    figures = {}
    for mode in (*modes, "none"):
        host = ToolHost(OracleBackend(ImageStore(), scenes=scenes))
        config = RunnerConfig(slots=slots, timeout_s=5.0, sandbox=mode, spawn=spawn)
        with warnings.catch_warnings(), SyncRunner(host, config) as r:
            warnings.simplefilter("ignore")
            if mode != "none":
                assert r.runner.isolation == mode, f"asked for {mode}, got {r.runner.isolation}"
            host.preload()  # as the commands do; else the first mode pays for loading the oracle
            r.run(trivial[:20])
            supervisor = r.runner.supervisor.pid if r.runner.supervisor else None
            stat0 = process_tree_stat(supervisor) if supervisor else (0.0, 0, 0)
            cpu0 = time.process_time() + stat0[0]
            t0 = time.perf_counter()
            out = r.run(trivial[20:])
            wall = time.perf_counter() - t0
            stat1 = process_tree_stat(supervisor) if supervisor else (0.0, 0, 0)
            cpu = time.process_time() + stat1[0] - cpu0
            faults = ((stat1[1] - stat0[1]) / len(out), (stat1[2] - stat0[2]) / len(out))
            t0 = time.perf_counter()
            tool_out = r.run(normal)
            normal_rate = 60 * len(tool_out) / (time.perf_counter() - t0)
            # One program at a time: what a program waits for when it does not queue behind others.
            alone = [r.run([pair])[0] for pair in one_by_one]
        assert all(x.status == "ok" for x in out + alone), {x.status for x in out + alone}
        figures[mode] = {
            "rate": 60 * len(out) / wall,
            "wall_per_program": wall / len(out),
            "normal_rate": normal_rate,
            "out": out,
            "tool_out": tool_out,
            "alone": alone,
            "cpu": cpu / len(out),
            "faults": faults,
        }
        host.close()
    none = figures["none"]
    load = os.getloadavg()[0]
    print(f"\n== sandbox ({', '.join(modes)}; {slots} slots, spawn {spawn}) vs in-process (no isolation, serial) ==")
    print(f"(load average {load:.1f} on {os.cpu_count()} cores when the run started; wall-clock figures assume the")
    print(" machine is ours: other work on it lengthens them, the CPU figures below do not depend on it)")
    print(f"{'':34}" + "".join(f"{m:>12}" for m in modes) + f"{'in-process':>12}")
    print(f"{'trivial programs / min':34}" + "".join(f"{figures[m]['rate']:12,.0f}" for m in (*modes, "none")))
    print(
        f"{'tool-using programs / min':34}" + "".join(f"{figures[m]['normal_rate']:12,.0f}" for m in (*modes, "none"))
    )
    for mode in modes:
        report_overhead(mode, figures[mode], none, slots)
    print("(queued: all programs submitted at once, so each waits for the cores behind the other slot's program,")
    print(" the making of spares and the tearing down of finished sandboxes: with slots = cores it is about the")
    print(" CPU per program. One at a time: the sandbox's own latency. Amortized: its cost to a batch.)")


def report_overhead(mode: str, sandbox: dict, none: dict, slots: int) -> None:
    overhead = {
        "trivial, queued": [s.duration_s - n.duration_s for s, n in zip(sandbox["out"], none["out"])],
        # Tool-host waits (batching windows, the cache) are not sandbox overhead: both sides leave them out.
        "tool-using, queued": [
            (s.duration_s - s.rpc_wait_s) - (n.duration_s - n.rpc_wait_s)
            for s, n in zip(sandbox["tool_out"], none["tool_out"])
        ],
        "trivial, one at a time": [s.duration_s - n.duration_s for s, n in zip(sandbox["alone"], none["alone"])],
    }
    amortized = 1000 * (sandbox["wall_per_program"] - none["wall_per_program"])
    print(f"-- {mode} --")
    print(f"overhead per trivial program, amortized (wall per program, sandbox - in-process): {amortized:.2f} ms")
    for name, values in overhead.items():
        print(
            f"overhead per {name} program: median {1000 * statistics.median(values):.2f} ms, "
            f"p99 {1000 * pct(values, 0.99):.2f} ms (start to result, minus the in-process run and tool waits)"
        )
    print(
        f"CPU per trivial program (runner + supervisor + sandboxes): {1000 * sandbox['cpu']:.2f} ms vs "
        f"{1000 * none['cpu']:.2f} ms in-process; at that cost {slots} cores run "
        f"{60 * min(slots, os.cpu_count() or 1) / sandbox['cpu']:,.0f} programs / min"
    )
    print(
        f"page faults per trivial program: supervisor {sandbox['faults'][0]:.0f}, sandboxes {sandbox['faults'][1]:.0f} "
        "(pages a fork shares and a write copies: most of a sandbox's cost)"
    )


def bench_grpo_cache(scenes, examples, n_questions: int, slots: int) -> None:
    rng = random.Random(2)
    pairs = []
    for example in examples[:n_questions]:
        a, b = rng.sample(NAMES, 2)
        pool = [t.format(a=a, b=b) for t in TEMPLATES]
        # 8 samples per question: the policy repeats itself often (identical programs) and otherwise
        # writes variants that ask the tools the same things in different ways.
        for k in range(8):
            src = pool[min(int(rng.expovariate(1.2)), len(pool) - 1)]
            pairs.append((example, src if rng.random() < 0.5 else src + f"# sample {k}\n"))
    print(f"\n== GRPO-like workload: {n_questions} questions x 8 samples, SlowOracle (3 ms/batch + 1 ms/call) ==")
    walls = {}
    for cache in (True, False):
        host = ToolHost(SlowOracle(ImageStore(), scenes=scenes), cache_size=200_000 if cache else 0)
        with SyncRunner(host, RunnerConfig(slots=slots, timeout_s=10.0)) as r:
            t0 = time.perf_counter()
            results = r.run(pairs)
            walls[cache] = time.perf_counter() - t0
        m = host.metrics()
        print(
            f"cache {'on ' if cache else 'off'}: wall {walls[cache]:.2f} s, tool calls {m['calls']}, "
            f"from cache {m['cache_hits']} + merged in flight {m['inflight_hits']} = {100 * m['cache_hit_rate']:.0f}%, "
            f"backend calls {m['backend_calls']}, statuses {sorted({x.status for x in results})}"
        )
        host.close()
    print(f"wall-time ratio without/with cache: {walls[False] / walls[True]:.2f}x")


class TinyConvBackend(ToolBackend):
    """A fake neural tool: `depth` = a small random conv net on each 64x64-resized crop."""

    name = "tinyconv"

    def __init__(self, images, **config):
        super().__init__(images, **config)
        import torch

        torch.manual_seed(0)
        torch.set_num_threads(1)
        self.torch = torch
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3, stride=2, padding=1),
            torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 3, stride=2, padding=1), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(64, 1),
        ).eval()  # fmt: skip

    def depth(self, calls):
        crops = []
        for call in calls:
            info = self.images.get(call.image)
            x0, y0, x1, y1 = box_to_top_left(call.box, info.height)
            crop = Image.fromarray(info.load_pixels()[y0:y1, x0:x1]).resize((64, 64))
            crops.append(np.asarray(crop, dtype=np.float32) / 255)
        with self.torch.no_grad():
            batch = self.torch.from_numpy(np.stack(crops)).permute(0, 3, 1, 2)
            return [float(v) for v in self.net(batch)[:, 0]]


def bench_batching(examples, n_calls: int = 512) -> None:
    print(f"\n== tiny conv-net tool: {n_calls} concurrent depth calls ==")
    rates = {}
    for batch in (1, 32):
        store = ImageStore()
        host = ToolHost(TinyConvBackend(store), max_batch_size=batch, max_wait_ms=2.0, cache_size=0)
        refs = [store.add_file(ex.image).ref for ex in examples[:8]]
        rng = random.Random(3)
        calls = []
        for i in range(n_calls):
            left, lower = rng.randint(0, 60), rng.randint(0, 40)
            calls.append(ToolCall("depth", refs[i % len(refs)], (left, lower, left + 40 + i % 20, lower + 40), {}))

        async def go(host=host, calls=calls):
            await host.call(calls[0])  # warm-up
            t0 = time.perf_counter()
            await asyncio.gather(*(host.call(c) for c in calls[1:]))
            return time.perf_counter() - t0

        wall = asyncio.run(go())
        rates[batch] = (n_calls - 1) / wall
        m = host.metrics()
        print(f"max_batch_size {batch:>2}: {rates[batch]:8.0f} calls/s, mean batch {m['mean_batch_size']:.1f}")
        host.close()
    print(f"batched / one-at-a-time throughput: {rates[32] / rates[1]:.1f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--programs", type=int, default=1500)
    p.add_argument("--questions", type=int, default=40)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--spawn", choices=("clone", "fork"), default="clone", help="how sandboxes are started")
    p.add_argument("--only", choices=("sandbox", "cache", "batching"), default=None, help="run one part")
    p.add_argument("--modes", default="full", help="sandboxes to compare with in-process: full, restricted or both")
    args = p.parse_args()
    modes = tuple(m for m in args.modes.split(",") if m)
    if not modes or any(m not in ("full", "restricted") for m in modes):
        p.error(f"--modes: a comma-separated list of full and restricted, got {args.modes!r}")
    with tempfile.TemporaryDirectory() as tmp:
        scenes, examples = make_world(Path(tmp), max(args.questions, 20))
        if args.only in (None, "sandbox"):
            bench_sandbox_vs_inprocess(scenes, examples, args.programs, args.slots, args.spawn, modes)
        if args.only in (None, "cache"):
            bench_grpo_cache(scenes, examples, args.questions, args.slots)
        if args.only in (None, "batching"):
            bench_batching(examples)


if __name__ == "__main__":
    main()
