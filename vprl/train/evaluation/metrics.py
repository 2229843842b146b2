"""Metrics per dataset, computed from the answers an inference mode settled on.

Every dataset's `headline` is its official metric, computed as the official script computes it
(`vprl/train/evaluation/official.py`); other conventions sit beside it in `variants`, each under its own
name (`vprl/train/evaluation/conventions.py` says whose it is), never in its place:

- GQA: accuracy, binary, open over the balanced questions, strings compared as they are; variants
  ViperGPT's (the prediction normalised, a failure read as "no") and vprl's training reward (both
  sides normalised);
- VQAv2 / OK-VQA: VQA soft accuracy over the ten annotators, per question group;
- Winoground: text, image and group scores (strict: "yes" to both captions is wrong); variant the
  per-pairing accuracy;
- SugarCREPE: per category, the share of entries whose positive caption scores higher than the
  negative; variants the mean over categories (the matrix cell), the stricter "both right" rule and
  the per-caption accuracy;
- NExT-QA: accuracy overall, per category (causal, temporal, descriptive) and per question type;
- RefCOCO/+/g: accuracy at IoU 0.5 and mean IoU; variants ViperGPT's (mean box for a failure,
  accuracy at IoU > 0.7);
- all: exception rate (syntax, runtime, bad return), timeout rate, refusal rate, the share of
  answers coming from the fallback, and "right for the wrong reason": the share of correct answers
  (by the training reward's match) whose program fails its unit tests (only where they were run).

Numbers with a fallback are never mixed into the no-fallback numbers: `dataset_metrics` computes
either, and the report shows both.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from vprl.data.records import Example
from vprl.rewards.correctness import correctness
from vprl.train.evaluation import official
from vprl.train.evaluation.conventions import DESCRIPTIONS, description

EXCEPTIONS = frozenset({"syntax_error", "runtime_error", "bad_return"})
TIMEOUTS = frozenset({"timeout"})
CORRECT_AT = 0.5  # a soft/IoU score at or above this counts as a correct answer for the rates


@dataclass(frozen=True)
class Prediction:
    """What one inference mode answered for one example.

    answer: the chosen program's answer (None when it failed or the mode refused).
    status: the chosen program's execution status.
    fallback_answer: the fallback tool's answer, set only when the program failed and a fallback
        was configured; the with-fallback metrics use it, the no-fallback ones never do.
    unit_test_score: the chosen program's unit-test score, when unit tests were run.
    attempts: programs executed to reach this answer (candidates, retries, re-prompts).
    tool_calls: the chosen program's trace, as `ToolCallRecord.to_json()` rows, for the run viewer's
        boxes and lines (empty in rows written before the field existed).
    turns: a repair episode's turns in order (`vprl.train.repair.episode.Turn.to_json()` rows without
        their tool calls), for the modes that write programs again (`repair`, `self_debug`,
        `reprompt_tests`); empty otherwise.
    """

    example_id: str
    answer: Any
    status: str
    program: str = ""
    refused: bool = False
    fallback_answer: Any = None
    unit_test_score: float | None = None
    attempts: int = 1
    error: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Prediction:
        return cls(**row)

    def final_answer(self, use_fallback: bool) -> Any:
        # fallback_answer is set only where the fallback applies (a failed program; with
        # fallback_below also a refused or low-scoring one)
        if use_fallback and self.fallback_answer is not None:
            return self.fallback_answer
        return None if self.refused else self.answer


@dataclass
class DatasetMetrics:
    dataset: str
    task: str
    n: int
    headline: dict[str, float]  # the official metric(s), computed as the official script does
    per_group: dict[str, dict[str, float]] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    variants: dict[str, float] = field(default_factory=dict)  # other conventions, by name
    counted: dict[str, int] = field(default_factory=dict)  # items each number averages over
    cell: str = ""  # the number a matrix cell shows (a headline, or for SugarCREPE a named variant)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> DatasetMetrics:
        return cls(**row)

    @property
    def family(self) -> str:
        """Which table of `conventions.DESCRIPTIONS` names this dataset's numbers."""
        family = dataset_family(self.dataset)
        if self.task == "grounding":
            return "grounding"
        if family in ("vqav2", "okvqa"):
            return "vqa"
        return family if family in DESCRIPTIONS else "other"

    def describe(self, name: str) -> str:
        return description(self.family, name)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def dataset_family(name: str) -> str:
    key = "".join(ch for ch in name.lower() if ch.isalnum())
    if key.startswith("refcoco"):
        return "refcoco"
    return key


_OFFICIAL = {"gqa": official.gqa, "winoground": official.winoground, "sugarcrepe": official.sugarcrepe}


def dataset_metrics(
    examples: Sequence[Example],
    predictions: Sequence[Prediction],
    use_fallback: bool = False,
    unit_test_pass: float = 0.5,
) -> DatasetMetrics:
    """Metrics for one dataset's examples (all of one dataset and task). Predictions are matched
    by example id; a missing prediction is an error naming it."""
    if not examples:
        raise ValueError("no examples to score")
    by_id = {p.example_id: p for p in predictions}
    missing = [e.id for e in examples if e.id not in by_id]
    if missing:
        raise ValueError(f"no prediction for {len(missing)} example(s), e.g. {missing[:3]}")
    datasets = {e.dataset for e in examples}
    tasks = {e.task for e in examples}
    if len(datasets) != 1 or len(tasks) != 1:
        raise ValueError(
            f"dataset_metrics takes one dataset and task at a time, got {sorted(datasets)} {sorted(tasks)}"
        )
    dataset, task = datasets.pop(), tasks.pop()
    preds = [by_id[e.id] for e in examples]
    answers = [p.final_answer(use_fallback) for p in preds]
    scores = [correctness(e, a) if a is not None else 0.0 for e, a in zip(examples, answers)]

    family = dataset_family(dataset)
    if family in _OFFICIAL:
        scored = _OFFICIAL[family](examples, answers)
    elif family == "nextqa" and task == "video_qa":
        scored = official.nextqa(examples, answers)
    elif task == "grounding":
        scored = official.grounding(examples, answers)
    else:
        name = "vqa_accuracy" if family in ("vqav2", "okvqa") else "accuracy"
        groups_v: dict[str, list[float]] = defaultdict(list)
        for e, s in zip(examples, scores):
            groups_v[e.group or "all"].append(s)
        per_group = {k: {name: _mean(v), "n": float(len(v))} for k, v in sorted(groups_v.items())}
        scored = official.Scored({name: _mean(scores)}, name, per_group, counted={name: len(scores)})

    statuses = Counter(p.status for p in preds)
    n = len(preds)
    correct = [s >= CORRECT_AT for s in scores]
    tested = [(c, p.unit_test_score) for c, p in zip(correct, preds) if c and p.unit_test_score is not None]
    rates = {
        "exception_rate": sum(statuses[s] for s in EXCEPTIONS) / n,
        "timeout_rate": sum(statuses[s] for s in TIMEOUTS) / n,
        "infra_error_rate": statuses["infra_error"] / n,
        "refusal_rate": sum(p.refused for p in preds) / n,
        "fallback_rate": sum(use_fallback and _fell_back(p) for p in preds) / n,
        "mean_attempts": _mean([float(p.attempts) for p in preds]),
    }
    if tested:
        rates["right_for_wrong_reason"] = sum(score < unit_test_pass for _, score in tested) / len(tested)
    return DatasetMetrics(
        dataset,
        task,
        n,
        scored.headline,
        scored.per_group,
        rates,
        dict(sorted(statuses.items())),
        scored.variants,
        scored.counted,
        scored.cell,
    )


def _fell_back(p: Prediction) -> bool:
    return p.fallback_answer is not None


# Cells of reports written before `cell` was recorded: the first of these the headline holds.
_OLD_CELLS = ("exact_match", "vqa_accuracy", "group", "pair_accuracy", "acc50", "accuracy")


def headline_key(m: DatasetMetrics) -> str:
    """The name of the number a matrix cell shows (GQA: accuracy; Winoground: group; RefCOCO:
    acc@0.5; SugarCREPE: the mean of the official per-category accuracies)."""
    if m.cell:
        return m.cell
    return next((k for k in _OLD_CELLS if k in m.headline), next(iter(m.headline)))


def headline_value(m: DatasetMetrics) -> float:
    """The single number a matrix cell shows for this dataset."""
    key = headline_key(m)
    return m.headline[key] if key in m.headline else m.variants[key]


def group_key(m: DatasetMetrics) -> str | None:
    """The official number of a `per_group` row (the per-type plots show it); None without groups."""
    rows = [row for row in m.per_group.values() if row]
    if not rows:
        return None
    first = headline_key(m)
    if all(first in row for row in rows):
        return first
    return next((k for k in rows[0] if k != "n"), None)
