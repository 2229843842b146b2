"""GPU acceptance in one command, on a bare CUDA machine with nothing to download:

    python bench/gpu/acceptance.py --out DIR [--budget_s 540] [--steps 2] [--calls 16]
    python bench/gpu/acceptance.py --tiny --out DIR     # the same code at toy sizes on a CPU (the test)
    python bench/gpu/acceptance.py --render DIR/results.jsonl   # the table of a run, even a cut-off one

Every model is built at its published size (bench/gpu/sizes.yaml) with random weights, once, directly
on the GPU in bf16: speed and memory do not depend on the weights. The step takes the shape of
configs/grpo_codellama_gqa_unit_tests.yaml. Results go to DIR/results.jsonl, one JSON line per
measurement, flushed and fsynced as it is taken, and DIR/results.md, rendered after every part. Each
part is guarded: a failure records its traceback and the next part runs; a part that needs what a
failed one makes is recorded as skipped. Parts run in order of value; one whose planned time no
longer fits --budget_s is skipped, and says so.

The plan (seconds of GPU time planned on one H100 or H200; 535 of the 540 default):

    part        planned  what
    preflight        30  versions, imports, the sandbox's isolation probe, GPU name and memory
    world             5  shapes-world questions, the recipe's real prompts, the step's programs
    policy           30  the 7B-shaped policy built on the GPU in bf16, LoRA-wrapped as the recipe
    step            110  2 GRPO-shaped steps without trl: generation, log-prob pass, forward/backward
    tools            40  ViUniT's models on the GPU: Grounding DINO, CLIP-L/336, BLIP-2 Flan-T5-XXL
    execution        40  the step's programs through the executor with those tools, twice
    tool_speed       80  ViUniT's tools batched against one call at a time, with peak memory
    layout           10  the layout check's predictions next to the measured memory
    vipergpt         40  ViperGPT's own models (CLIP-L/224, DPT-Large) batched against one at a time
    codegemma_step   60  one step in CodeGemma-7B's shape (vocabulary 256,000): its peak memory
    grpo_trl         90  GRPO steps through trl's trainer, where trl imports (the GPU machine has none)

Where the sandbox's probe finds no user namespaces, execution runs in the restricted sandbox, as a
training run would (`sandbox: auto`); where even that cannot start, in-process without isolation
(`sandbox: none`), and the results say so.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu import grpo_trl, predicted, preflight, stack, step  # noqa: E402
from bench.gpu.context import Context, hide_packages  # noqa: E402
from bench.gpu.record import Recorder, read, render, run_part  # noqa: E402

BUDGET_S = 540.0  # 9 minutes of the device's 15, leaving its start-up and a rerun of a short part
PLAN: list[tuple[str, float, Callable[[Context], None]]] = [
    ("world", 5, step.world),
    ("policy", 30, step.policy),
    ("step", 110, step.step),
    ("tools", 40, stack.tools),
    ("execution", 40, stack.execution),
    ("tool_speed", 80, stack.tool_speed),
    ("layout", 10, predicted.layout),
    ("vipergpt", 40, stack.vipergpt),
    ("codegemma_step", 60, step.codegemma_step),
    ("grpo_trl", 90, grpo_trl.grpo_trl),
]
PREFLIGHT_S = 30.0
PARTS = ["preflight", *(name for name, _, _ in PLAN)]
GPU_MACHINE_LACKS = "trl,datasets,dill,multiprocess,vllm"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="bench/gpu/acceptance.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=os.environ.get("OUT") or "acceptance-results", help="results folder (default: $OUT, else ./acceptance-results)")  # fmt: skip
    ap.add_argument("--tiny", action="store_true", help="toy sizes on the CPU (the test of this script)")
    ap.add_argument("--budget_s", type=float, default=BUDGET_S, help=f"seconds for all parts (default {BUDGET_S:.0f})")
    ap.add_argument("--steps", type=int, default=2, help="steps of the step and grpo_trl parts (the first warms up)")
    ap.add_argument("--calls", type=int, default=16, help="tool calls per tool_speed measurement")
    ap.add_argument("--sandbox", choices=("auto", "full", "restricted", "none"), default="auto", help="auto: full where the probe finds every layer, restricted without namespaces, else none")  # fmt: skip
    ap.add_argument("--without", default="", help=f"packages to treat as absent, as on the GPU machine ({GPU_MACHINE_LACKS})")  # fmt: skip
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts to run (preflight always runs)")
    ap.add_argument("--fail_part", default=None, choices=PARTS, help="raise inside this part (tests the guard)")
    ap.add_argument("--kill_after", default=None, choices=PARTS, help="SIGKILL this process after this part (tests that results are on disk)")  # fmt: skip
    ap.add_argument(
        "--render", default=None, metavar="RESULTS_JSONL", help="print the table of a results file and exit"
    )
    args = ap.parse_args(argv)
    unknown = sorted(set(args.parts.split(",")) - set(PARTS))
    if unknown:
        ap.error(f"--parts: unknown {unknown}; valid: {', '.join(PARTS)}")
    if args.steps < 1 or args.calls < 1:
        ap.error("--steps and --calls must be at least 1")
    return args


def injected(name: str, fn: Callable[[Context], None]) -> Callable[[Context], None]:
    def fail(ctx: Context) -> None:
        raise RuntimeError(f"failure injected into part {name} by --fail_part")

    return fail


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        path = Path(args.render)
        if not path.is_file():
            print(f"error: --render: {path} does not exist", file=sys.stderr)
            return 2
        print(render(read(path)), end="")
        return 0
    hidden = [n for n in args.without.split(",") if n]
    if hidden:
        hide_packages(hidden)
    rec = Recorder(Path(args.out))
    rec.write("preflight", "run", scale="tiny" if args.tiny else "real", date=time.strftime("%Y-%m-%d %H:%M"),
              argv=sys.argv[1:] if argv is None else argv, budget_s=args.budget_s,
              plan={"preflight": PREFLIGHT_S, **{name: s for name, s, _ in PLAN}})  # fmt: skip
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    if args.tiny:
        torch.set_num_threads(1)  # toy models: a second thread costs more than it gives on a busy CPU
    chosen = set(args.parts.split(","))
    failed = 0
    with tempfile.TemporaryDirectory(prefix="vprl-acceptance-") as tmp:
        ctx = Context(rec=rec, scale="tiny" if args.tiny else "real", device=device, root=Path(tmp),
                      calls=args.calls, steps=args.steps, sandbox=args.sandbox)  # fmt: skip
        parts = [("preflight", PREFLIGHT_S, lambda c: preflight.run(c, hidden)), *PLAN]
        for name, planned, fn in parts:
            if name != "preflight" and name not in chosen:
                continue
            part = injected(name, fn) if name == args.fail_part else fn
            status = run_part(
                rec, name, lambda part=part: part(ctx), planned, args.budget_s, always=name == "preflight"
            )
            failed += status in ("failed", "timed out")
            rec.render()
            if name == args.kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
            gc.collect()
            if ctx.cuda:
                torch.cuda.empty_cache()
        ctx.built.clear()  # the models go before the folder their tokenizers came from
    rec.close()
    print(rec.render().read_text(encoding="utf-8"), end="")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
