"""Each dataset's official metric, computed the way its official script computes it, and the named
variants reported beside it (`vprl/train/evaluation/conventions.py` says what each name means).

How a program's answer enters an official script, where the script expects a model's output:

- GQA (`eval.py`) compares the prediction string with the answer string, `==`, and averages over
  the balanced questions only, overall and split into binary and open questions. The prediction is
  the answer's text as `answer_to_text` writes it (a string untouched, True/False as yes/no, a
  whole number without ".0"); a failed program has no prediction and is wrong.
- SugarCREPE (`main_eval.py`) counts an entry right when the positive caption scores strictly higher
  than the negative, per category. Winoground compares the four pairings strictly the same way. A
  yes/no program's score for a caption is 1 for yes and 0 for anything else, a failure included.
- NExT-QA (`eval_mc.py`) compares the predicted option index with the answer index, overall and per
  question type (TP counted as TN), and per category (causal, temporal, descriptive). The predicted
  index is the first option whose text is exactly the answer's.
- RefCOCO has no official script: accuracy at IoU >= 0.5 is the field's convention and mean IoU
  what ViperGPT reports, both with a failed program at IoU 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vprl.data.loaders.gqa import answer_type, is_balanced
from vprl.data.loaders.nextqa import TYPE_GROUP
from vprl.data.loaders.sugarcrepe import CATEGORIES
from vprl.data.loaders.winoground_scores import winoground_scores
from vprl.data.records import Example
from vprl.rewards.answer_normalization import answer_to_text
from vprl.rewards.correctness import correctness, grounding_scores, iou, yes_no
from vprl.train.evaluation.conventions import VIPERGPT_ACC_ABOVE, vipergpt_box, vipergpt_gqa_prediction

NEXTQA_CATEGORIES = {"C": "causal", "T": "temporal", "D": "descriptive"}


@dataclass
class Scored:
    """One dataset's numbers: `headline` the official ones, `variants` the others (by name), `counted`
    how many items each number averages over, and `cell` the one number a matrix cell shows."""

    headline: dict[str, float]
    cell: str
    per_group: dict[str, dict[str, float]] = field(default_factory=dict)
    variants: dict[str, float] = field(default_factory=dict)
    counted: dict[str, int] = field(default_factory=dict)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _reference(example: Example) -> str:
    if not example.answers:
        raise ValueError(f"example {example.id!r} ({example.dataset}): no reference answer to score against")
    return example.answers[0]


def _yes_score(answer: Any) -> float:
    return 1.0 if yes_no(answer) == "yes" else 0.0


def gqa(examples: Sequence[Example], answers: Sequence[Any]) -> Scored:
    right: dict[str, list[float]] = defaultdict(list)
    groups: dict[str, list[float]] = defaultdict(list)
    for e, a in zip(examples, answers):
        if is_balanced(e):
            score = float(answer_to_text(a) == _reference(e))
            right["accuracy"].append(score)
            right[answer_type(e)].append(score)
            groups[e.group or "all"].append(score)
    vipergpt = [float(vipergpt_gqa_prediction(a) == _reference(e)) for e, a in zip(examples, answers)]
    lenient = [correctness(e, a) if a is not None else 0.0 for e, a in zip(examples, answers)]
    return Scored(
        headline={k: _mean(right[k]) for k in ("accuracy", "binary", "open")},
        cell="accuracy",
        per_group={g: {"accuracy": _mean(v), "n": float(len(v))} for g, v in sorted(groups.items())},
        variants={"vipergpt_accuracy": _mean(vipergpt), "normalised_match": _mean(lenient)},
        counted={k: len(right[k]) for k in ("accuracy", "binary", "open")}
        | {"vipergpt_accuracy": len(examples), "normalised_match": len(examples)},
    )


def sugarcrepe(examples: Sequence[Example], answers: Sequence[Any]) -> Scored:
    entries: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
    items: dict[str, list[float]] = defaultdict(list)
    for e, a in zip(examples, answers):
        category = str(e.meta.get("category") or e.group or "all")
        polarity = str(e.meta.get("polarity", "pos"))
        if polarity not in ("pos", "neg"):
            raise ValueError(f"SugarCREPE example {e.id!r}: meta polarity {polarity!r} is not pos or neg")
        entries[(category, str(e.meta.get("entry") or e.id))][polarity] = a
        items[category].append(correctness(e, a))
    official: dict[str, list[float]] = defaultdict(list)
    strict: dict[str, list[float]] = defaultdict(list)
    for (category, entry), pair in entries.items():
        if set(pair) != {"pos", "neg"}:
            raise ValueError(
                f"SugarCREPE entry {entry!r}: needs its positive and its negative caption, got {sorted(pair)}"
            )
        official[category].append(float(_yes_score(pair["pos"]) > _yes_score(pair["neg"])))
        strict[category].append(float(yes_no(pair["pos"]) == "yes" and yes_no(pair["neg"]) == "no"))
    order = [c for c in CATEGORIES if c in official] + sorted(set(official) - set(CATEGORIES))
    headline = {c: _mean(official[c]) for c in order}
    per_group = {
        c: {
            "accuracy": headline[c],
            "both_right": _mean(strict[c]),
            "item_accuracy": _mean(items[c]),
            "n": float(len(official[c])),
        }
        for c in order
    }
    variants = {
        "category_mean": _mean(list(headline.values())),
        "both_right": _mean([_mean(strict[c]) for c in order]),
        "item_accuracy": _mean([s for c in order for s in items[c]]),
    }
    counted = {c: len(official[c]) for c in order} | {"item_accuracy": len(examples)}
    return Scored(headline, "category_mean", per_group, variants, counted)


def winoground(examples: Sequence[Example], answers: Sequence[Any]) -> Scored:
    wg = winoground_scores(examples, [_yes_score(a) for a in answers])
    items = [correctness(e, a) for e, a in zip(examples, answers)]
    return Scored(
        headline={"text": wg.text, "image": wg.image, "group": wg.group},
        cell="group",
        per_group={tag: dict(row) for tag, row in wg.per_group.items()},
        variants={"item_accuracy": _mean(items)},
        counted={"text": wg.n, "image": wg.n, "group": wg.n, "item_accuracy": len(examples)},
    )


def grounding(examples: Sequence[Example], answers: Sequence[Any]) -> Scored:
    scores = [grounding_scores(e, a) for e, a in zip(examples, answers)]
    viper = []
    for e, a in zip(examples, answers):
        box = vipergpt_box(a)
        viper.append(iou(box, e.box) if box is not None else 0.0)
    groups: dict[str, list[dict[str, float]]] = defaultdict(list)
    for e, g in zip(examples, scores):
        groups[e.group or "all"].append(g)
    n = len(examples)
    return Scored(
        headline={"acc50": _mean([g["acc50"] for g in scores]), "miou": _mean([g["iou"] for g in scores])},
        cell="acc50",
        per_group={
            k: {"acc50": _mean([g["acc50"] for g in v]), "miou": _mean([g["iou"] for g in v]), "n": float(len(v))}
            for k, v in sorted(groups.items())
        },
        variants={
            "vipergpt_miou": _mean(viper),
            "vipergpt_acc70": _mean([float(v > VIPERGPT_ACC_ABOVE) for v in viper]),
        },
        counted=dict.fromkeys(("acc50", "miou", "vipergpt_miou", "vipergpt_acc70"), n),
    )


def _option_index(example: Example) -> tuple[list[str], int]:
    options, index = example.meta.get("possible_answers"), example.meta.get("answer_index")
    if not isinstance(options, list) or not isinstance(index, int) or not 0 <= index < len(options):
        raise ValueError(
            f"NExT-QA example {example.id!r}: meta needs 'possible_answers' and 'answer_index' "
            f"(got {options!r}, {index!r}); load it with vprl.data.loaders.nextqa"
        )
    return options, index


def nextqa(examples: Sequence[Example], answers: Sequence[Any]) -> Scored:
    groups: dict[str, list[float]] = defaultdict(list)
    for e, a in zip(examples, answers):
        options, index = _option_index(e)
        text = answer_to_text(a)
        chosen = options.index(text) if text in options else None
        qtype = TYPE_GROUP.get(str(e.meta.get("type", e.group)))
        if qtype is None:
            raise ValueError(
                f"NExT-QA example {e.id!r}: question type {e.meta.get('type')!r} is not one of {list(TYPE_GROUP)}"
            )
        groups[qtype].append(float(chosen == index))
    every = [s for v in groups.values() for s in v]
    headline = {"accuracy": _mean(every)}
    counted = {"accuracy": len(every)}
    for letter, name in NEXTQA_CATEGORIES.items():
        scores = [s for g, v in groups.items() if g.startswith(letter) for s in v]
        if scores:  # the official script divides by the count: it has no number for an empty category
            headline[name], counted[name] = _mean(scores), len(scores)
    order = [g for g in dict.fromkeys(TYPE_GROUP.values()) if g in groups]
    lenient = [correctness(e, a) if a is not None else 0.0 for e, a in zip(examples, answers)]
    return Scored(
        headline,
        "accuracy",
        {g: {"accuracy": _mean(groups[g]), "n": float(len(groups[g]))} for g in order},
        {"normalised_match": _mean(lenient)},
        counted | {"normalised_match": len(examples)},
    )
