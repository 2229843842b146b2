"""Evaluate policies across datasets and inference modes: the cross-task generalization matrix.

    python -m vprl.train.evaluation --config configs/eval/X.yaml [--adapters a=runs/a/adapter,b=...]
        [--datasets shapes:val,shapes:heldout,gqa,vqav2,okvqa,winoground,sugarcrepe] [--key value ...]

Each policy (the base model, and the base with each adapter) answers every dataset with every
configured inference mode (`vprl.train.evaluation.modes`), for every seed; `vprl.train.evaluation.report`
writes `evaluation.json`, `evaluation.md`, the tables (`evaluation.csv`, `per_type.csv`,
`evaluation.tex`) and the plots under `--out`, and this module `predictions.jsonl`: one row per
policy, mode, seed and question with the question, its reference and whether the answer was right
(`prediction_row`; `conventions.PREDICTION_FIELDS` says what each field holds).
Everything that can be checked is checked before the executor starts or a model is loaded:
dataset names and roots, the policy and its adapters' base, the tool stack and the overrides of
self-tuning, the unit-test settings, and whether the prompts fit the policy's context.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vprl.data.records import Example
from vprl.rewards.correctness import correctness
from vprl.train.evaluation.config import EvalConfig
from vprl.train.evaluation.metrics import CORRECT_AT, DatasetMetrics, Prediction, dataset_metrics
from vprl.train.evaluation.modes import ModeConfig
from vprl.train.evaluation.plan import (
    EvalPlan,
    Policy,
    check_context,
    load_examples,
    validate,
)
from vprl.train.evaluation.seen import seen_queries, split_seen
from vprl.train.evaluation.tables import FALLBACK_SUFFIX

__all__ = ["EvalConfig", "EvalPlan", "Policy", "evaluate", "main", "prepare", "validate"]


GeneratorFactory = Callable[[Policy], Any]


def prepare(cfg: EvalConfig, check_prompts: bool = True) -> tuple[EvalPlan, dict[str, list[Example]]]:
    """Validate the config and load the examples: everything that can fail on bad input."""
    plan = validate(cfg)
    data = {name: load_examples(cfg, name) for name in plan.datasets}
    if cfg.seen_split:
        data = split_seen(data, cfg.seen_split, seen_queries(cfg.seen_from))
    if check_prompts:
        check_context(cfg, data, plan.modes)
    return plan, data


def evaluate(
    cfg: EvalConfig,
    make_generator: GeneratorFactory | None = None,
    prepared: tuple[EvalPlan, dict[str, list[Example]]] | None = None,
) -> dict[str, Any]:
    """Run the whole evaluation. `make_generator(policy)` replaces loading the policy with
    transformers (tests drive the pipeline with a scripted `vprl.train.sampling.generator.Generator`)."""
    from tqdm import tqdm

    from vprl.train.evaluation.report import write_reports
    from vprl.train.evaluation.session import EvalSession

    plan, data = prepared or prepare(cfg, check_prompts=make_generator is None)
    results: dict[str, dict[str, dict[str, dict[int, DatasetMetrics]]]] = {}
    predictions: list[dict[str, Any]] = []
    started = time.time()
    jobs = [(mode, seed, name) for mode in plan.modes for seed in plan.seeds for name in data]
    with EvalSession(cfg) as session:
        for policy in plan.policies:
            session.load_policy(policy, make_generator)
            bar = tqdm(total=sum(len(data[name]) for *_, name in jobs), desc=f"evaluate {policy.label}", unit="q")
            for mode, seed, name in jobs:
                examples = data[name]
                bar.set_postfix_str(f"{mode.label} seed {seed} {name}")
                preds = session.predict(examples, mode, seed, progress=bar.update)
                by_id = {e.id: e for e in examples}
                key = {"policy": policy.label, "mode": mode.label, "dataset": name, "seed": seed}
                predictions += [prediction_row(key, by_id[p.example_id], p, mode.fallback) for p in preds]
                variants = [(mode.label, False)] + ([(mode.label + FALLBACK_SUFFIX, True)] if mode.fallback else [])
                for label, use_fallback in variants:
                    metrics = dataset_metrics(examples, preds, use_fallback=use_fallback)
                    results.setdefault(policy.label, {}).setdefault(label, {}).setdefault(name, {})[seed] = metrics
            bar.close()
        tools = session.tool_metrics()
    seconds = time.time() - started
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "predictions.jsonl", "w", encoding="utf-8") as f:
        for row in predictions:
            f.write(json.dumps(row) + "\n")
    modes = mode_descriptions(plan.modes)
    paths = write_reports(
        results,
        out,
        extra={"config": asdict(cfg), "seconds": round(seconds, 1), "examples": {k: len(v) for k, v in data.items()}}
        | {"tool_metrics": tools},
        modes=modes,
    )
    paths["predictions"] = out / "predictions.jsonl"
    return {"results": results, "paths": paths, "seconds": seconds, "modes": modes}


def mode_descriptions(modes: list[ModeConfig]) -> dict[str, str]:
    """Each row label of the report -> what the mode did (the glossary's lines)."""
    out = {}
    for mode in modes:
        out[mode.label] = mode.description
        if mode.fallback:
            out[mode.label + FALLBACK_SUFFIX] = mode.fallback_description
    return out


def _score(example: Example, answer: Any) -> float:
    return correctness(example, answer) if answer is not None else 0.0


def prediction_row(key: dict[str, Any], example: Example, pred: Prediction, fallback: bool) -> dict[str, Any]:
    """One line of predictions.jsonl: which run, the question and its reference, what the mode
    answered, and its score and verdict without (and, with the fallback on, with) the fallback."""
    gold = list(example.box) if example.task == "grounding" and example.box is not None else list(example.answers)
    score = _score(example, pred.final_answer(False))
    row = (
        key
        | {"query": example.query, "gold": gold}
        | pred.to_json()
        | {"score": score, "correct": score >= CORRECT_AT}
    )
    if fallback:
        with_fallback = _score(example, pred.final_answer(True))
        row |= {"score_with_fallback": with_fallback, "correct_with_fallback": with_fallback >= CORRECT_AT}
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from vprl.data.cli import checked
    from vprl.train.recipe.parsing import parse_config

    # Bad input ends with its message and exit status 2; a failure during the run keeps its traceback.
    (cfg,) = checked(
        parse_config,
        [EvalConfig],
        argv if argv is not None else sys.argv[1:],
        prog="python -m vprl.train.evaluation",
        description=__doc__.split("\n\n")[0],
    )
    prepared = checked(prepare, cfg)
    report = evaluate(cfg, prepared=prepared)
    from vprl.train.evaluation.report import markdown

    print(markdown(report["results"], report["modes"]))
    for kind, path in report["paths"].items():
        print(f"{kind:>24}: {path}")
    print(f"evaluate: {report['seconds']:.0f}s")
    return report
