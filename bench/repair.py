"""Does learned repair pay? (#35) The miniature over several seeds, three GRPO runs per seed with the
same budget (steps, questions and samples per step). Prints figures; asserts nothing.

    python bench/repair.py [--seeds 0,1,2] [--max_steps 250] [--out runs/repair] [--repair_share 0.3]
        [--repair_noun_share 0.4] [--pass_threshold 0.5] [--repeat_cost 0] [--branches 1] [--guide_weight 0]
        [--turn_advantage 0] [--first_credit episode] [--first_weight 1] [--later_credit episode]
        [--replay_weight 0] [--later_turns greedy] [--bootstrap_epochs 3] [--relabel_share 0] [--noun_weight 1]
        [--threads 2]

Per seed: the tiny policy bootstrapped with that seed and, weakly, repair examples (a wrong program,
its real feedback, the corrected one; `vprl.train.bootstrap`, cached per seed; `--bootstrap_epochs`
its passes over the mixture, `--relabel_share` the share of its question pairs with their shape and
colour words permuted, meant to teach copying the question's nouns, which it did not: docs/benchmarks.md;
`--noun_weight` the weight of those words in its loss), then:

- `single`: the quickstart recipe (correctness reward), one program per question;
- `repair`: the same reward over two-turn episodes: a program that fails to run or fails its visual
  unit tests is shown its error, its tool calls and the failed tests, and written again (the
  unit-test reward at weight 0 gives the check; no verdict: the evaluation could not show one);
  `--repeat_cost` charges a second program that is the first again (`repair_repeat_cost`);
  `--branches B` shares each sampled first program among B rows of its group, each writing its own
  second program (`repair_branches`, turn-level groups); `--guide_weight W` adds, weighted, SFT on
  each wrong first program followed by a right program of its question from the batch
  (`repair_guide_weight`); `--turn_advantage W` adds, on the second programs' tokens, W times their
  contrast within their block (`repair_turn_advantage`, GiGPO's step-level groups; with `--branches`);
  `--first_credit own` trains the first program on its own reward, as the single run does, and
  leaves the episode's reward to the later programs (`repair_first_credit`; `both`: the two summed;
  `none`: the first program not trained);
  `--later_credit fresh` pays the later programs for beating a fresh first program of their question
  (`repair_later_credit`);
  `--replay_weight W` adds, weighted, SFT on the bootstrap's own repair pairs replayed at every step
  (`repair_replay_weight`, PPO-ptx's anchor);
- `repair_label_free`: the label-free recipe (unit-test reward) over the same episodes, trained on a
  copy of the world whose every answer is a sentinel, withheld at load time; every file of the run
  is searched for the sentinel afterwards.

Every run's policy is evaluated before and after RL on the evaluation world's training-family
questions never trained on (`configs/eval/shapes_repair.yaml`), at two program executions per
question at most: one greedy program; majority of 2 samples; best of 2 by unit tests (ViUniT's
selection); untrained re-prompting with the failed tests, one round (ViUniT's); two-turn repair,
whose episodes end at the unit-test score a repair run's episodes ended at in training
(`--pass_threshold`; re-prompting keeps the config's 1.0).

Figures, with 95 % intervals from a two-level bootstrap (seeds, then questions;
`vprl.train.evaluation.gains`): the repair run's two-turn repair against the single run's best of 2,
against its majority of 2 and against its untrained re-prompting; both runs' repair with the
better-tested turn kept against each other (what RL adds to the bootstrap's repair examples) and
against best of 2; each arm's gain (after - before)
in its own mode; the label-free repair gain as a share of the labelled one; the mean executions per
question in each mode; the repair rate per step (metrics.jsonl), plotted to `<out>/repair_rate.png`;
the second program's lift over a fresh first program of its question (`resample_lift`, from the
runs' episodes: does the second turn read its feedback?).
Records go to `<out>/runs.jsonl`, figures to `<out>/repair.json`. An interrupted call, run again,
skips the arms it recorded and resumes the one it was in from its last checkpoint (`--save_steps`).

One call per seed side by side, at one thread each, lets every seed progress at once (on two cores
no faster: 40 s a repair step per call with three side by side, 13.4 s of the machine a step, against
13.2 s for one call at two threads); then one call collects them:

    python bench/repair.py --seeds 0 --threads 1 --out runs/repair_s0   # and so on, side by side
    python bench/repair.py --collect runs/repair_s0,runs/repair_s1,runs/repair_s2 --out runs/repair
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.learning import settings_of, step_seconds  # noqa: E402
from bench.repair_args import BOOTSTRAP_EPOCHS, parse_args  # noqa: E402
from bench.repair_report import KEPT_BEST, MODES, markdown, plot, summarize  # noqa: E402
from vprl.train.bootstrap.repair_pairs import REPAIR_FEEDBACK, UNIT_TESTS  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EVAL_CONFIG = REPO / "configs/eval/shapes_repair.yaml"
SENTINEL = "zq-sentinel-answer-3517"
# The bootstrap's settings a record keeps, by their flag, with `BootstrapConfig`'s name for each.
BOOTSTRAP = {
    "repair_share": "repair_share",
    "repair_noun_share": "repair_noun_share",
    "bootstrap_epochs": "epochs",
    "relabel_share": "relabel_share",
    "noun_weight": "noun_weight",
    "feedback": "repair_feedback",
}
# Their values in every record from before their flags existed: its passes over the mixture
# (`--bootstrap_epochs`), its share of relabelled pairs (`--relabel_share`) and its nouns' loss weight.
BOOTSTRAP_BEFORE = {
    "bootstrap_epochs": BOOTSTRAP_EPOCHS,
    "relabel_share": 0.0,
    "noun_weight": 1.0,
    "feedback": ",".join(REPAIR_FEEDBACK.show),
}
# The episodes the bootstrap's repair examples show (the same feedback and unit tests; the parts shown,
# `--feedback`, are added per call).
EPISODES = (
    f"--repair_max_turns 2 --repair_stop_when {REPAIR_FEEDBACK.stop_when} --repair_check {REPAIR_FEEDBACK.check}"
)
ARMS = {
    "single": (REPO / "configs/quickstart.yaml", ""),
    "repair": (
        REPO / "configs/quickstart.yaml",
        EPISODES
        + " --rewards '"
        + json.dumps(
            [{"name": "correctness", "weight": 1.0}, {"name": "unit_tests", "weight": 0.0, "settings": UNIT_TESTS}]
        )
        + "'",
    ),
    "repair_label_free": (REPO / "configs/quickstart_label_free.yaml", EPISODES + " --dataset_labels false"),
}


def bootstrap_settings(args: argparse.Namespace) -> dict:
    return {flag: getattr(args, flag) for flag in BOOTSTRAP}


def policy_for(seed: int, args: argparse.Namespace) -> Path:
    from vprl.train.bootstrap.fit import BootstrapConfig, ensure_tiny_policy

    # 1024 positions: an episode (prompt, two programs, a feedback block) outgrows the default 512. The
    # tiny Llama's positions are rotary, so this changes no weight, only what fits.
    more = {name: getattr(args, flag) for flag, name in BOOTSTRAP.items()} | {"context": 1024, "threads": args.threads}
    more["repair_feedback"] = args.feedback.split(",")
    return ensure_tiny_policy(BootstrapConfig(out=str(Path(args.out) / f"policy_seed{seed}"), seed=seed, **more))


def sentinel_world(policy: Path) -> Path:
    """A copy of the policy's training world whose every question answers the sentinel."""
    world = policy.parent / f"{policy.name}_sentinel_world"
    if (world / "manifest.json").is_file():
        return world
    shutil.copytree(policy / "world", world, dirs_exist_ok=True)
    for path in (world / "gqa").glob("*_questions.json"):
        rows = json.loads(path.read_text())
        for row in rows.values():
            row["answer"], row["fullAnswer"] = SENTINEL, f"The answer is {SENTINEL}."
        path.write_text(json.dumps(rows))
    return world


def leaks(run_dir: Path) -> list[str]:
    return [str(p) for p in run_dir.rglob("*") if p.is_file() and SENTINEL.encode() in p.read_bytes()]


def eval_args(args: argparse.Namespace) -> str:
    """The evaluation's arguments beyond its config: the repair mode judged at the threshold the
    repair runs trained at (every arm and policy alike, so their rows compare), its later turns
    greedy or sampled."""
    more = f"--repair_pass_threshold {args.pass_threshold}"
    if args.feedback != BOOTSTRAP_BEFORE["feedback"]:
        more += f" --show {args.feedback}"
    return more if args.later_turns == "greedy" else f"{more} --later_turns {args.later_turns}"


# The repair settings an arm trains with, each the bench's flag of the same name: its record's key ->
# (the recipe key, the value of a run without it: the single arm's, and every record's from before the
# setting existed; the arms the flag applies to).
REPAIR_ARMS = ("repair", "repair_label_free")
ARM_SETTINGS = {
    "repeat_cost": ("repair_repeat_cost", 0.0, REPAIR_ARMS),  # a one-turn run has no later program to repeat
    "branches": ("repair_branches", 1, REPAIR_ARMS),
    "guide_weight": ("repair_guide_weight", 0.0, ("repair",)),  # grpo, labelled
    "turn_advantage": ("repair_turn_advantage", 0.0, REPAIR_ARMS),  # grpo, branched
    "first_credit": ("repair_first_credit", "episode", REPAIR_ARMS),  # grpo
    "first_weight": ("repair_first_weight", 1.0, REPAIR_ARMS),  # grpo
    "later_credit": ("repair_later_credit", "episode", REPAIR_ARMS),  # grpo
    "replay_weight": ("repair_replay_weight", 0.0, REPAIR_ARMS),  # grpo; the bootstrap's repair_pairs.jsonl
}


def arm_settings(arm: str, args: argparse.Namespace) -> dict:
    """Each of `ARM_SETTINGS` for `arm`: the flag's value where it applies, the default elsewhere."""
    return {name: getattr(args, name) if arm in arms else off for name, (_, off, arms) in ARM_SETTINGS.items()}


def run_arm(seed: int, arm: str, policy: Path, args: argparse.Namespace) -> dict:
    import torch

    from vprl.train.quickstart import main as quickstart

    torch.set_num_threads(args.threads)

    recipe, rl_args = ARMS[arm]
    # Checkpoints often: a call stopped midway (a session's end) resumes from the last one (resume: true).
    rl_args += f" --save_steps {args.save_steps}"
    if arm != "single":
        rl_args += f" --repair_pass_threshold {args.pass_threshold} --repair_feedback {args.feedback}"
    for name, value in arm_settings(arm, args).items():
        if value != ARM_SETTINGS[name][1]:
            rl_args += f" --{ARM_SETTINGS[name][0]} {value}"
    if arm == "repair_label_free":
        rl_args += f" --dataset_root {sentinel_world(policy)}"
    started = time.time()
    report = quickstart(
        [
            "--seed", str(seed),
            "--model_name_or_path", str(policy),
            "--skip_bootstrap", "true",
            "--out", str(Path(args.out) / f"seed{seed}"),
            "--rl_config", str(recipe),
            "--rl_args", f"{rl_args} --report_to none",
            "--run_name", arm,
            "--max_steps", str(args.max_steps),
            "--eval_config", str(EVAL_CONFIG),
            "--eval_world", str(Path(args.out) / "shapes_eval"),
            "--eval_args", eval_args(args),
        ]
    )  # fmt: skip
    run_dir = Path(report["run_dir"])
    labels = {name: _label(report, name, eval_args(args)) for name in MODES if name not in KEPT_BEST}
    return {
        "seed": seed,
        "arm": arm,
        "max_steps": args.max_steps,
        **bootstrap_settings(args),
        "pass_threshold": args.pass_threshold,
        **arm_settings(arm, args),
        "recipe": settings_of(recipe) + " " + rl_args,
        "eval_config": settings_of(EVAL_CONFIG),
        "eval_args": eval_args(args),
        "started": started,
        "timing": report["timing"],
        "rl_step_s": step_seconds(str(run_dir)),
        "run_dir": str(run_dir),
        "predictions": str(report["paths"]["predictions"]),
        "seen_from": str(policy / "world"),
        "labels": labels,
        "repair_curve": _repair_curve(run_dir),
        "leaks": leaks(run_dir) if arm == "repair_label_free" else None,
    }


def _label(report: dict, name: str, more: str = "") -> str:
    """The report's row label of a mode (`ModeConfig.label`), found by its name's settings (the
    config's, with the evaluation's arguments `more`)."""
    from vprl.train.evaluation.pipeline import EvalConfig
    from vprl.train.evaluation.plan import mode_configs
    from vprl.train.recipe.parsing import parse_config

    (cfg,) = parse_config([EvalConfig], ["--config", str(EVAL_CONFIG), *shlex.split(more)])
    by_name = {m.name: m.label for m in mode_configs(cfg)}
    if by_name[name] not in next(iter(report["results"].values())):
        raise KeyError(f"mode {name} ({by_name[name]}) is not in the evaluation's results")
    return by_name[name]


def _repair_curve(run_dir: Path) -> list[tuple[int, float]]:
    out = []
    with open(run_dir / "metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if "repair/repair_rate" in row:
                out.append((int(row["step"]), float(row["repair/repair_rate"])))
    return out


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def collect(other: Path, out: Path) -> None:
    """`other`'s records joined to `out`'s (those already there skipped), and its evaluation world
    where `out` has none: every call builds the same one (the quickstart's seed)."""
    if not (other / "runs.jsonl").is_file():
        raise FileNotFoundError(f"--collect: {other} has no runs.jsonl")
    have = {r["run_dir"] for r in records(out / "runs.jsonl")}
    with open(out / "runs.jsonl", "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records(other / "runs.jsonl") if r["run_dir"] not in have)
    if not (out / "shapes_eval" / "manifest.json").is_file():
        shutil.copytree(other / "shapes_eval", out / "shapes_eval", dirs_exist_ok=True)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv, list(ARMS), __doc__.split("\n\n")[0])
    seeds, arms = args.seeds, args.arms
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_file = out / "runs.jsonl"
    for other in [Path(d) for d in args.collect.split(",") if d.strip()]:
        collect(other, out)
    done = records(runs_file)
    wanted = dict(
        max_steps=args.max_steps,
        **bootstrap_settings(args),
        pass_threshold=args.pass_threshold,
        eval_config=settings_of(EVAL_CONFIG),
        eval_args=eval_args(args),
    )
    runs = [
        r
        for r in done
        if r["seed"] in seeds
        and r["arm"] in arms
        and all(r.get(k, BOOTSTRAP_BEFORE.get(k)) == v for k, v in wanted.items())
        and all(r.get(k, ARM_SETTINGS[k][1]) == v for k, v in arm_settings(r["arm"], args).items())
    ]
    for seed in seeds:
        for arm in arms:
            if any(r["seed"] == seed and r["arm"] == arm for r in runs):
                continue  # measured by an earlier, interrupted call
            if any(r["seed"] == seed and r["arm"] == arm for r in done):  # its checkpoints would be resumed
                sys.exit(f"repair: {out / f'seed{seed}' / arm} was trained with other settings; move it away first")
            run = run_arm(seed, arm, policy_for(seed, args), args)
            runs.append(run)
            with open(runs_file, "a", encoding="utf-8") as f:
                f.write(json.dumps(run) + "\n")
    summary = summarize(runs, out / "shapes_eval", list(ARMS))
    summary.update(max_steps=args.max_steps, **bootstrap_settings(args))
    (out / "repair.json").write_text(json.dumps(summary, indent=2))
    plot(runs, out / "repair_rate.png")
    print("\n" + markdown(summary))
    print(f"\nrecords: {runs_file}; figures: {out / 'repair.json'}; plot: {out / 'repair_rate.png'}")
    return summary


if __name__ == "__main__":
    main()
