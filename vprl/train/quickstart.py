"""The main job on the embedded default: `python -m vprl.train.quickstart` (what `make quickstart` runs).

On a CPU, with nothing downloaded:

1. bootstrap the tiny code policy (`vprl.train.bootstrap`: a locally trained tokenizer and a 3M-parameter
   Llama fitted on shapes-world questions paired with gold *and* plausibly wrong programs), cached;
2. RL with GRPO on the world's training questions (`configs/quickstart.yaml`: LoRA, the sandboxed
   executor, the pixel-only `shapes` tools, the correctness reward; `--rl_config
   configs/quickstart_label_free.yaml` trains on the visual unit-test reward alone, without labels);
3. evaluate the policy before and after RL on a fresh world (`configs/eval/shapes_matrix.yaml`):
   the training families on new images, the held-out families, image-text matching and grounding;
4. print accuracy before/after per question family, and where the run, adapter and plots are.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from vprl.data.shapes import BuildConfig, build_dataset
from vprl.paths import checkout_file

# The defaults of `rl_config` and `eval_config`: files of the source checkout (configs/ is no package).
RL_CONFIG = "configs/quickstart.yaml"
EVAL_CONFIG = "configs/eval/shapes_matrix.yaml"


@dataclass
class QuickstartConfig:
    out: str = field(default="runs/quickstart", metadata={"help": "folder of the RL run and the evaluation"})
    seed: int = field(default=0, metadata={"help": "seed of the policy's bootstrap and of RL"})
    model_name_or_path: str = field(
        default="runs/tiny_policy",
        metadata={"help": "the tiny policy's folder (built by vprl.train.bootstrap when missing)"},
    )
    rl_config: str = field(
        default="", metadata={"help": f"the RL recipe (default: the source checkout's {RL_CONFIG})"}
    )
    eval_config: str = field(
        default="", metadata={"help": f"the evaluation config (default: the source checkout's {EVAL_CONFIG})"}
    )
    eval_world: str = field(default="runs/shapes_eval", metadata={"help": "the evaluation's shapes world (made here)"})
    eval_seed: int = field(default=1, metadata={"help": "seed of the evaluation world, apart from the training one"})
    max_steps: int = field(default=0, metadata={"help": "RL steps (0: the recipe's)"})
    skip_bootstrap: bool = field(
        default=False, metadata={"help": "use `model_name_or_path` as it is (any causal LM folder)"}
    )
    rl_args: str = field(
        default="", metadata={"help": "more vprl.train.rl arguments, e.g. '--beta 0.04' (an ablation of the recipe)"}
    )
    eval_args: str = field(
        default="",
        metadata={"help": "more vprl.train.evaluation arguments, e.g. '--repair_pass_threshold 0.5'"},
    )
    run_name: str = field(
        default="", metadata={"help": "name of the RL run's folder under `out` (default: the recipe's)"}
    )


def ensure_eval_world(cfg: QuickstartConfig) -> Path:
    root = Path(cfg.eval_world)
    # 320 images: about 100 of their training-family questions were never asked in training (the
    # unseen part, the headline) and 220 were (the seen part); 320 held-out-family questions.
    wanted = {"seed": cfg.eval_seed, "val": 320, "winoground": 40, "sugarcrepe": 8, "refcoco": 50}
    manifest = root / "manifest.json"
    if manifest.is_file():
        have = json.loads(manifest.read_text()).get("config", {})
        if all(have.get(k) == v for k, v in wanted.items()):
            return root
    print(f"quickstart: generating the evaluation world {root} (seed {cfg.eval_seed})", flush=True)
    build_dataset(BuildConfig(out=str(root), train=10, **wanted))
    return root


TITLES = {
    "shapes:val-unseen": "training families, queries never trained on (new images)",
    "shapes:val-seen": "training families, queries also asked in training (new images)",
    "shapes:val": "training families, new images",
    "shapes:heldout": "held-out families",
}


def family_table(report: dict, datasets: tuple[str, ...] = tuple(TITLES)) -> str:
    """Accuracy before/after RL per question family, one block per dataset."""
    results = report["results"]
    before, after = list(results)[:2] if len(results) > 1 else (list(results)[0], None)
    lines = []
    for ds in datasets:
        b = _first_seed(results, before, ds)
        a = _first_seed(results, after, ds) if after else None
        if b is None:
            continue
        lines.append(f"\n{ds}  ({TITLES.get(ds, ds)})")
        lines.append(f"  {'family':<24}{'n':>5}{before:>14}{after or '':>14}{'change':>9}")
        for group, row in b.per_group.items():
            score_b = _score(row)
            score_a = _score(a.per_group.get(group, {})) if a else None
            change = f"{100 * (score_a - score_b):+9.1f}" if score_a is not None else ""
            a_text = f"{100 * score_a:14.1f}" if score_a is not None else ""
            lines.append(f"  {group:<24}{int(row.get('n', 0)):>5}{100 * score_b:14.1f}{a_text}{change}")
        total_b = _headline(b)
        total_a = _headline(a) if a else None
        tail = f"{100 * total_a:14.1f}{100 * (total_a - total_b):+9.1f}" if total_a is not None else ""
        lines.append(f"  {'all':<24}{b.n:>5}{100 * total_b:14.1f}{tail}")
    return "\n".join(lines)


EXPECTED = Path(__file__).with_name("quickstart_expected.yaml")
PARTS = {"unseen": "shapes:val-unseen", "seen": "shapes:val-seen", "heldout": "shapes:heldout"}


def expected_gains(rl_config: str) -> dict[str, dict] | None:
    """The documented gains for this recipe (vprl/train/quickstart_expected.yaml), None for another."""
    import yaml

    return yaml.safe_load(EXPECTED.read_text(encoding="utf-8")).get(Path(rl_config).stem)


def comparison(report: dict, expected: dict[str, dict]) -> str:
    """The newcomer's gains next to the documented ones: one run is one draw, so it is judged against
    mean +- 2 std over seeds, not against the interval of the mean."""
    results = report["results"]
    before, after = list(results)[:2]
    lines = [
        f"  {'part':<9}{'yours':>8}   {'documented: mean ± std [95% interval of the mean]':<52}{'one run: mean ± 2 std':<24}",
    ]
    for part, ds in PARTS.items():
        b, a, e = _first_seed(results, before, ds), _first_seed(results, after, ds), expected.get(part)
        if b is None or a is None or e is None:
            continue
        gain = 100 * (_headline(a) - _headline(b))
        low, high = e["mean"] - 2 * e["std"], e["mean"] + 2 * e["std"]
        verdict = "within" if low <= gain <= high else "OUTSIDE"
        documented = f"{e['mean']:+.1f} ± {e['std']:.1f} [{e['interval'][0]:+.1f}, {e['interval'][1]:+.1f}]"
        lines.append(f"  {part:<9}{gain:+8.1f}   {documented:<52}[{low:+.1f}, {high:+.1f}] {verdict}")
    return "\n".join(lines)


def _first_seed(results, policy, ds):
    if policy is None:
        return None
    for mode, by_ds in results[policy].items():
        if "+fallback" not in mode and ds in by_ds:
            seeds = by_ds[ds]
            return seeds[min(seeds)]
    return None


def _score(row: dict) -> float | None:
    values = [v for k, v in row.items() if k != "n"]
    return values[0] if values else None


def _headline(metrics) -> float:
    from vprl.train.evaluation.metrics import headline_value

    return headline_value(metrics)


def rl_run_name(cfg: QuickstartConfig) -> str:
    """The RL run's folder under `out` (its evaluation's under `out/eval/`): the recipe's name with
    "quickstart" read as "rl", so configs/quickstart.yaml writes `rl` and the label-free one `rl_label_free`."""
    return cfg.run_name or Path(cfg.rl_config or RL_CONFIG).stem.replace("quickstart", "rl").strip("_") or "rl"


def evaluate_before_after(cfg: QuickstartConfig, policy: Path, adapter: Path | str, run_name: str) -> dict:
    """The evaluation config's report for the policy without and with the RL adapter, on the
    evaluation world, the policy's training queries counting as seen."""
    from vprl.train.evaluation.pipeline import EvalConfig, evaluate
    from vprl.train.recipe.parsing import parse_config

    (ecfg,) = parse_config(
        [EvalConfig],
        [
            "--config", cfg.eval_config,
            "--model_name_or_path", str(policy),
            "--base_label", "before_rl",
            "--adapters", f"after_rl={adapter}",
            "--shapes_root", str(ensure_eval_world(cfg)),
            "--seen_from", str(Path(policy) / "world"),
            "--out", str(Path(cfg.out) / "eval" / run_name),
            *shlex.split(cfg.eval_args),
        ],
    )  # fmt: skip
    return evaluate(ecfg)


def main(argv: list[str] | None = None) -> dict:
    from vprl.train.recipe.parsing import ConfigError, parse_config

    (cfg,) = parse_config(
        [QuickstartConfig],
        argv if argv is not None else sys.argv[1:],
        prog="python -m vprl.train.quickstart",
        description=__doc__.split("\n\n")[0],
    )
    try:  # the defaults are files of the source checkout, which an installed vprl does not have
        cfg.rl_config = cfg.rl_config or str(checkout_file(RL_CONFIG))
        cfg.eval_config = cfg.eval_config or str(checkout_file(EVAL_CONFIG))
    except FileNotFoundError as exc:
        raise ConfigError(f"rl_config, eval_config: {exc}") from None
    started = time.time()
    os.environ.setdefault("WANDB_MODE", "offline")

    policy = Path(cfg.model_name_or_path)
    if not cfg.skip_bootstrap:
        from vprl.train.bootstrap.fit import BootstrapConfig, ensure_tiny_policy

        print("quickstart: 1/3 the tiny policy (vprl.train.bootstrap; cached after the first run)", flush=True)
        policy = ensure_tiny_policy(BootstrapConfig(out=str(policy), seed=cfg.seed))
    world = policy / "world"
    if not (world / "manifest.json").is_file():
        raise ConfigError(f"policy: {world} holds no shapes world; build the policy with vprl.train.bootstrap")
    t_policy = time.time()

    print("quickstart: 2/3 RL on the shapes world (GRPO, LoRA, sandboxed executor, shapes tools)", flush=True)
    from vprl.train.rl import main as rl_main

    run_name = rl_run_name(cfg)
    run_dir = Path(cfg.out) / run_name
    rl_args = [
        "--config", cfg.rl_config,
        "--model_name_or_path", str(policy),
        "--dataset_root", str(world),
        "--output_dir", str(run_dir),
        "--seed", str(cfg.seed),
    ]  # fmt: skip
    if cfg.max_steps:
        rl_args += ["--max_steps", str(cfg.max_steps)]
    rl_args += shlex.split(cfg.rl_args)
    adapter = rl_main(rl_args)
    t_rl = time.time()

    print("quickstart: 3/3 evaluation before and after RL on a fresh world", flush=True)
    report = evaluate_before_after(cfg, policy, adapter, run_name)
    t_eval = time.time()

    from vprl.train.evaluation.report import markdown

    print("\n" + markdown(report["results"]).split("## Details")[0])
    print("Accuracy (%) per question family, greedy, one program per question:")
    print(family_table(report))
    expected = expected_gains(cfg.rl_config)
    if expected and len(report["results"]) > 1:
        print(f"\nYour gains (points) next to the documented three-seed figures ({EXPECTED.name}):")
        print(comparison(report, expected))
    print(
        f"\ntime: policy {t_policy - started:.0f} s, RL {t_rl - t_policy:.0f} s, evaluation {t_eval - t_rl:.0f} s, "
        f"total {t_eval - started:.0f} s (seed {cfg.seed})"
    )
    print(f"policy:   {policy}")
    print(f"RL run:   {run_dir}  (rollouts.jsonl, metrics.jsonl, manifest.json; wandb offline under wandb/)")
    print(f"adapter:  {adapter}")
    for kind, path in report["paths"].items():
        print(f"{kind + ':':<10}{path}")
    report["timing"] = {"policy_s": t_policy - started, "rl_s": t_rl - t_policy, "eval_s": t_eval - t_rl}
    report["run_dir"], report["adapter"] = str(run_dir), str(adapter)
    return report


if __name__ == "__main__":
    from vprl.train.recipe.parsing import run_command

    run_command(main)
