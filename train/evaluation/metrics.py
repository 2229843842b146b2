"""Official metrics per dataset, computed from the answers an inference mode settled on.

Every dataset gets its paper's headline number(s) plus the same execution-side rates:

- GQA: exact match after normalisation, per question group (GQA's `detailed` type);
- VQAv2 / OK-VQA: VQA soft accuracy over the ten annotators, per question group;
- Winoground: text, image and group scores (strict comparisons: "yes" to both captions is wrong);
- SugarCREPE: per category, the share of image/caption pairs judged right on both the positive
  and the negative caption, and the per-item yes/no accuracy;
- RefCOCO/+/g: mean IoU and accuracy at IoU 0.5;
- all: exception rate (syntax, runtime, bad return), timeout rate, refusal rate, the share of
  answers coming from the fallback, and "right for the wrong reason": the share of correct answers
  whose program fails its unit tests (only where unit tests were run).

Numbers with a fallback are never mixed into the no-fallback numbers: `dataset_metrics` computes
either, and the report shows both.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from data.loaders.winoground_scores import winoground_scores
from data.records import Example
from rewards.correctness import correctness, grounding_scores, yes_no

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
    headline: dict[str, float]  # the paper's number(s) for this dataset
    per_group: dict[str, dict[str, float]] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> DatasetMetrics:
        return cls(**row)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _dataset_family(name: str) -> str:
    key = "".join(ch for ch in name.lower() if ch.isalnum())
    if key.startswith("refcoco"):
        return "refcoco"
    return key


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

    family = _dataset_family(dataset)
    per_group: dict[str, dict[str, float]] = {}
    if family == "winoground":
        yes = [1.0 if yes_no(a) == "yes" else 0.0 for a in answers]
        wg = winoground_scores(examples, yes)
        headline = {"text": wg.text, "image": wg.image, "group": wg.group, "item_accuracy": _mean(scores)}
        per_group = {tag: {k: v for k, v in row.items()} for tag, row in wg.per_group.items()}
    elif family == "sugarcrepe":
        headline, per_group = _sugarcrepe(examples, scores)
    elif task == "grounding":
        grounding = [grounding_scores(e, a) for e, a in zip(examples, answers)]
        headline = {"miou": _mean([g["iou"] for g in grounding]), "acc50": _mean([g["acc50"] for g in grounding])}
        groups: dict[str, list[dict[str, float]]] = defaultdict(list)
        for e, g in zip(examples, grounding):
            groups[e.group or "all"].append(g)
        per_group = {
            k: {"miou": _mean([g["iou"] for g in v]), "acc50": _mean([g["acc50"] for g in v]), "n": float(len(v))}
            for k, v in sorted(groups.items())
        }
    else:
        name = "vqa_accuracy" if family in ("vqav2", "okvqa") else "exact_match" if family == "gqa" else "accuracy"
        headline = {name: _mean(scores)}
        groups_v: dict[str, list[float]] = defaultdict(list)
        for e, s in zip(examples, scores):
            groups_v[e.group or "all"].append(s)
        per_group = {k: {name: _mean(v), "n": float(len(v))} for k, v in sorted(groups_v.items())}

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
    return DatasetMetrics(dataset, task, n, headline, per_group, rates, dict(sorted(statuses.items())))


def _fell_back(p: Prediction) -> bool:
    return p.fallback_answer is not None


def _sugarcrepe(examples: Sequence[Example], scores: Sequence[float]) -> tuple[dict, dict]:
    pairs: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    items: dict[str, list[float]] = defaultdict(list)
    for e, s in zip(examples, scores):
        category = str(e.meta.get("category") or e.group or "all")
        entry = str(e.meta.get("entry") or e.id)
        polarity = str(e.meta.get("polarity", "pos"))
        pairs[(category, entry)][polarity] = s
        items[category].append(s)
    by_category: dict[str, list[float]] = defaultdict(list)
    for (category, _), row in pairs.items():
        by_category[category].append(float(all(v >= CORRECT_AT for v in row.values()) and len(row) == 2))
    per_group = {
        c: {"pair_accuracy": _mean(by_category[c]), "item_accuracy": _mean(items[c]), "n": float(len(by_category[c]))}
        for c in sorted(by_category)
    }
    headline = {
        "pair_accuracy": _mean([v["pair_accuracy"] for v in per_group.values()]),  # macro over categories
        "item_accuracy": _mean([s for v in items.values() for s in v]),
    }
    return headline, per_group


HEADLINE_KEYS = ("exact_match", "vqa_accuracy", "group", "pair_accuracy", "acc50", "accuracy")


def headline_key(m: DatasetMetrics) -> str:
    """Which of the dataset's numbers a matrix cell shows (Winoground: group; RefCOCO: acc@0.5)."""
    return next((k for k in HEADLINE_KEYS if k in m.headline), next(iter(m.headline)))


def headline_value(m: DatasetMetrics) -> float:
    """The single number a matrix cell shows for this dataset."""
    return m.headline[headline_key(m)]
