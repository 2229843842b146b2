"""The main job on the embedded default: `python -m train.quickstart` (what `make quickstart` runs).

It builds the shapes world (cached), runs programs on every task through the sandboxed executor
with the pixel-only `shapes` tools, scores them with the correctness reward, and reports accuracy
per task and question family, with a plot. Two program sources are compared:

- `gold`: the world's reference program for each question (the ceiling a policy can reach with
  these tools; the gap to 100% is perception error);
- `direct`: the end-to-end baseline that hands the question to `simple_query` (VQA) or asks the
  tools to match the caption (image-text matching) — what a program without composition gets.

Until the RL trainer lands this is the end-to-end run; the RL quickstart replaces the program
sources with a policy's samples before and after training.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from data.records import Example, write_jsonl
from data.shapes import BuildConfig, build_dataset, load_gold_programs
from data.shapes.tasks import load_shapes_tasks
from executor.host import ToolHost
from executor.runner import RunnerConfig, SyncRunner
from executor.tools.stack import build_backend
from rewards.compose import RewardComposer, RewardConfig
from train.evaluation.fallback import fallback_program

REPO = Path(__file__).resolve().parents[1]
EVAL_TASKS = ("val", "heldout", "winoground", "sugarcrepe", "refcoco")


@dataclass
class QuickstartConfig:
    out: str = "runs/quickstart"
    seed: int = 0
    train: int = 200  # training questions generated (unused until RL lands, kept for the cache key)
    val: int = 300  # evaluation questions per split
    tools: str = str(REPO / "configs/tools/shapes.yaml")
    sandbox: str = "full"  # "none" runs programs in-process (debugging only)
    slots: int = 2
    timeout_s: float = 5.0


def direct_program(example: Example) -> str:
    return fallback_program(example)


def ensure_world(cfg: QuickstartConfig) -> Path:
    root = Path(cfg.out) / "shapes"
    wanted = {"seed": cfg.seed, "train": cfg.train, "val": cfg.val}
    manifest = root / "manifest.json"
    if manifest.is_file():
        have = json.loads(manifest.read_text()).get("config", {})
        if all(have.get(k) == v for k, v in wanted.items()):
            print(f"shapes world: reusing {root}")
            return root
    print(f"shapes world: generating {root} (seed {cfg.seed})")
    build_dataset(BuildConfig(out=str(root), train=cfg.train, val=cfg.val, seed=cfg.seed))
    return root


def accuracy_table(rows: list[dict]) -> dict[str, dict[str, float]]:
    """`{task/family: {source: accuracy}}` plus one row per task."""
    sums: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        score = r["correctness"] if r["correctness"] is not None else 0.0
        sums[r["task"]][r["source"]].append(score)
        sums[f"{r['task']}/{r['group']}"][r["source"]].append(score)
    return {k: {s: sum(v) / len(v) for s, v in by.items()} for k, by in sorted(sums.items())}


def plot(table: dict[str, dict[str, float]], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install 'vprl[plots]')")
        return None
    keys = [k for k in table if "/" in k]
    sources = sorted({s for v in table.values() for s in v})
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(keys) + 1.5))
    height = 0.8 / len(sources)
    for i, source in enumerate(sources):
        ax.barh(
            [j + i * height for j in range(len(keys))],
            [100 * table[k].get(source, 0) for k in keys],
            height=height,
            label=source,
        )
    ax.set_yticks([j + 0.4 - height / 2 for j in range(len(keys))], keys, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("accuracy (%)")
    ax.set_xlim(0, 100)
    ax.set_title("Shapes world: programs run in the sandbox with the pixel-only shapes tools")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    from train.config import parse_config

    (cfg,) = parse_config((QuickstartConfig,), argv if argv is not None else sys.argv[1:])
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    root = ensure_world(cfg)
    tasks = load_shapes_tasks(root, list(EVAL_TASKS))
    gold = load_gold_programs(root)
    jobs: list[tuple[str, str, Example, str]] = []  # (task name, source, example, program)
    for name, examples in tasks.items():
        for ex in examples:
            jobs.append((name, "gold", ex, gold[ex.task][ex.query]))
            jobs.append((name, "direct", ex, direct_program(ex)))
    backend = build_backend(cfg.tools)
    runner_cfg = RunnerConfig(slots=cfg.slots, timeout_s=cfg.timeout_s, sandbox=cfg.sandbox)
    t0 = time.perf_counter()
    with SyncRunner(ToolHost(backend), runner_cfg) as runner:
        results = runner.run([(ex, prog) for _, _, ex, prog in jobs], progress=True)
    seconds = time.perf_counter() - t0
    batch = RewardComposer(RewardConfig())([j[2] for j in jobs], results, [j[3] for j in jobs])
    rows = [
        {
            "task": name,
            "source": source,
            "example_id": ex.id,
            "group": ex.group,
            "program": prog,
            **{k: v for k, v in r.to_json().items() if k != "example_id"},
            "correctness": batch.components["correctness"][i],
            "reward": batch.totals[i],
        }
        for i, ((name, source, ex, prog), r) in enumerate(zip(jobs, results))
    ]
    write_jsonl(out / "results.jsonl", rows)
    table = accuracy_table(rows)
    statuses: dict[str, int] = defaultdict(int)
    for r in results:
        statuses[r.status] += 1
    summary = {
        "config": asdict(cfg),
        "programs": len(jobs),
        "seconds": round(seconds, 1),
        "programs_per_minute": round(60 * len(jobs) / max(seconds, 1e-9)),
        "statuses": dict(statuses),
        "accuracy": table,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    png = plot(table, out / "accuracy.png")
    print(f"\n{'task / family':<42}{'gold':>8}{'direct':>8}")
    for key, by in table.items():
        indent = "  " if "/" in key else ""
        print(f"{indent + key:<42}{100 * by.get('gold', 0):>7.1f}%{100 * by.get('direct', 0):>7.1f}%")
    print(
        f"\n{len(jobs)} programs in {seconds:.1f}s ({summary['programs_per_minute']}/min), statuses {dict(statuses)}"
    )
    print(f"results: {out / 'results.jsonl'}\nsummary: {out / 'summary.json'}" + (f"\nplot:    {png}" if png else ""))
    return table


if __name__ == "__main__":
    main()
