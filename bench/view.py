"""How long the run viewer takes to write its page, how big the page is, and what the traces cost.

    python bench/view.py [--sizes 1000 10000 100000] [--train 400] [--limit 400]

A shapes world is built at GQA's image size (500x375), and its gold programs and their plausible
mutants (`vprl.data.shapes.mutations`, plus a crash and a syntax error) are run in-process with the
`shapes` tools: real programs, real tool-call traces. A run folder of N rollouts is made from them
(GRPO groups of 8 samples of one question, 8 questions a step, as in the GQA recipes) and
`python -m vprl.train.view` writes its page, cold (no picture made before). Printed per N: the write
time, the page's size (HTML, data.js, pictures) and, where Chromium is installed, the time until the
page has rendered its first cards. Last, the disk the traces (`rollout_traces: true`) add to
rollouts.jsonl per 10,000 rollouts.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GROUP = 8  # samples per question
QUESTIONS_PER_STEP = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000], help="rollouts per run folder")
    p.add_argument("--train", type=int, default=400, help="questions of the world (distinct questions of the runs)")
    p.add_argument("--limit", type=int, default=400, help="groups on the page (the viewer's --limit)")
    p.add_argument("--no-browser", action="store_true", help="do not time the page in Chromium")
    return p.parse_args(argv)


def programs_and_traces(world: Path) -> list[tuple]:
    """(example, program, outcome, trace) for every gold program and its variants."""
    from vprl.data.shapes import load_gold_programs
    from vprl.data.shapes.mutations import mutate
    from vprl.data.shapes.tasks import load_shapes_tasks
    from vprl.executor.api import SourceImage
    from vprl.executor.program import run_in_process
    from vprl.executor.tools.images import ImageStore
    from vprl.executor.tools.local import LocalToolClient
    from vprl.executor.tools.shapes import ShapesBackend

    examples = load_shapes_tasks(world, ["train"])["train"]
    gold = load_gold_programs(world)["vqa"]
    backend = ShapesBackend(ImageStore())
    out = []
    for ex in examples:
        program = gold[ex.query]
        variants = [program, *(m.program for m in mutate(program)[:4])]
        variants += [program.replace("ImagePatch(image)", "ImagePatch(img)"), program.replace("(", "", 1)]
        info = backend.images.add_file(ex.image)
        for source in variants:
            client = LocalToolClient(backend)
            outcome, _, _ = run_in_process(source, {"image": SourceImage(info.ref, info.width, info.height)}, client)
            out.append((ex, source, outcome, [c.to_json() for c in client.trace]))
    return out


def write_run(folder: Path, world: Path, pool: list[tuple], n: int, traces: bool = True) -> Path:
    """A run folder of `n` rollouts drawn from `pool`, grouped as GRPO groups them."""
    import yaml

    from vprl.executor.program import program_key
    from vprl.rewards.correctness import correctness
    from vprl.train.rollouts.log import RolloutLog, RolloutRow

    by_example: dict[str, list[tuple]] = {}
    for item in pool:
        by_example.setdefault(item[0].id, []).append(item)
    ids = sorted(by_example)
    rng = random.Random(0)
    penalties = {"syntax_error": -1.0, "runtime_error": -0.5}
    rows = []
    for i in range(n // GROUP):
        step = 1 + i // QUESTIONS_PER_STEP
        options = by_example[ids[i % len(ids)]]
        for _ in range(GROUP):
            ex, program, outcome, trace = rng.choice(options)
            score = correctness(ex, outcome.answer) if outcome.status == "ok" else None
            rows.append(
                RolloutRow(
                    step=step,
                    example_id=ex.id,
                    prompt_hash="0" * 16,
                    program=program,
                    status=outcome.status,
                    answer=outcome.answer,
                    components={"correctness": score},
                    total=score if score is not None else penalties.get(outcome.status, -0.5),
                    query=ex.query,
                    dataset=ex.dataset,
                    task=ex.task,
                    group=ex.group,
                    program_key=program_key(program),
                    error=outcome.error,
                    policy="bench",
                    tool_calls=trace if traces else [],
                )
            )
    folder.mkdir(parents=True, exist_ok=True)
    config = {"algorithm": "grpo", "dataset": "shapes", "dataset_root": str(world), "dataset_tasks": ["train"]}
    config |= {"num_generations": GROUP, "scale_rewards": "group", "rollout_traces": traces}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    RolloutLog.in_run(folder).append(rows)
    return folder


def open_seconds(page: Path) -> float | None:
    """Seconds from navigating to the page until its first cards are in the document."""
    sys.path.insert(0, str(REPO / "tests"))
    from chromium import Browser, find_chromium

    executable = find_chromium()
    if executable is None:
        return None
    with Browser(executable, timeout_s=120) as browser:
        start = time.perf_counter()
        browser.open(page.as_uri())
        browser.eval(
            "new Promise(r => { const f = () => document.querySelector('.card') ? r(1) : setTimeout(f, 5); f(); })"
        )
        seconds = time.perf_counter() - start
        if browser.errors():
            raise RuntimeError(f"the page logged errors: {browser.errors()[:3]}")
        return seconds


def main(argv: list[str] | None = None) -> None:
    from vprl.data.shapes import BuildConfig, build_dataset
    from vprl.train.view import ViewOptions, build_view

    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-view-"))
    try:
        world = tmp / "world"
        build_dataset(BuildConfig(out=str(world), train=args.train, val=0, winoground=0, sugarcrepe=0, refcoco=0,
                                  width=500, height=375, workers=1))  # fmt: skip
        start = time.perf_counter()
        pool = programs_and_traces(world)
        print(f"{len(pool)} programs run with the shapes tools in {time.perf_counter() - start:.1f} s")
        print(
            f"{'rollouts':>9} {'log MB':>7} {'write s':>8} {'cards':>6} {'pictures':>8} {'page MB':>8} {'open s':>7}"
        )
        for n in args.sizes:
            run = write_run(tmp / f"run{n}", world, pool, n)
            log_mb = (run / "rollouts.jsonl").stat().st_size / 1e6
            result = build_view(run, ViewOptions(limit=args.limit))
            opened = None if args.no_browser else open_seconds(result["page"])
            print(
                f"{n:>9,} {log_mb:>7.1f} {result['seconds']:>8.1f} {result['cards']:>6,} {result['images']:>8,} "
                f"{result['bytes'] / 1e6:>8.1f} {'-' if opened is None else f'{opened:.1f}':>7}"
            )
            shutil.rmtree(run)
        with_traces = write_run(tmp / "traced", world, pool, 10_000) / "rollouts.jsonl"
        without = write_run(tmp / "untraced", world, pool, 10_000, traces=False) / "rollouts.jsonl"
        calls = sum(len(json.loads(line)["tool_calls"]) for line in with_traces.read_text().splitlines())
        extra = with_traces.stat().st_size - without.stat().st_size
        print(
            f"traces per 10,000 rollouts: {extra / 1e6:.1f} MB ({calls:,} tool calls, {extra / max(calls, 1):.0f} B each); "
            f"rollouts.jsonl {with_traces.stat().st_size / 1e6:.1f} MB with them, {without.stat().st_size / 1e6:.1f} MB without"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
