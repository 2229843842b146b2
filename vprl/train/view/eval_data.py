"""An evaluation folder as page data: every question under two policies, side by side.

`python -m vprl.train.evaluation` writes `predictions.jsonl` (one row per policy, mode, dataset, seed
and question) and `evaluation.json`, whose `config` names where the questions came from; they are
loaded again for their pictures and gold. A pair is one question of one mode and seed under the
two policies (by default the first two the file names: before and after RL). Where there are more
pairs than the page shows, the pairs whose verdict changed come first, then the others, drawn at
random; the page says how many of each it shows.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from vprl.data.records import Example, read_jsonl
from vprl.data.retired_names import RETIRED
from vprl.data.typed import mismatch
from vprl.train.view.cards import make_card, right
from vprl.train.view.images import Pictures

PREDICTIONS_FILE = "predictions.jsonl"
EVALUATION_FILE = "evaluation.json"
KINDS = ("fixed", "broken", "both_right", "both_wrong", "unknown")  # fixed: wrong before, right after


@dataclass
class EvalData:
    cards: list[dict[str, Any]]
    pairs: list[dict[str, Any]]
    policies: tuple[str, str]
    total_pairs: int
    kinds: dict[str, int]  # over every pair, not only the shown ones
    notes: list[str] = field(default_factory=list)


def saved_config(folder: Path, shapes_root: str | None):
    """The evaluation's `EvalConfig` as `evaluation.json` saved it (`shapes_root` replaced if given)."""
    from vprl.train.evaluation.config import EvalConfig

    path = folder / EVALUATION_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no {EVALUATION_FILE} beside {PREDICTIONS_FILE} (pass --no_examples)")
    try:
        saved = json.loads(path.read_text(encoding="utf-8")).get("config")
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ValueError(f"{path}: not an evaluation report ({exc})") from None
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: config: missing (an evaluation report written by vprl.train.evaluation has it)")
    known = {f.name for f in fields(EvalConfig)}
    try:
        # A report written before the vocabulary's renaming names some settings the old way.
        renamed = {RETIRED.get(k, k) if k not in known else k: v for k, v in saved.items()}
        cfg = EvalConfig(**{k: v for k, v in renamed.items() if k in known})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: config: {exc}") from None
    if shapes_root:
        cfg.shapes_root = shapes_root
    cfg.limit = 0  # ids are looked up, so every example may be loaded: the report's limit kept a prefix
    return cfg


def eval_roots(folder: Path, cfg) -> list[str]:
    """The folders the evaluation's questions came from: images are read only under these (and the folder)."""
    roots = list(cfg.data_roots.values())  # checked as the config was read (EvalConfig)
    return [str(r) for r in [cfg.shapes_root, *roots] if isinstance(r, str) and r]


def eval_examples(folder: Path, cfg, names: set[str]) -> dict[str, dict[str, Example]]:
    """dataset name (as predictions.jsonl has it) -> example id -> Example."""
    from vprl.train.evaluation.plan import load_examples
    from vprl.train.evaluation.seen import SUFFIXES

    path = folder / EVALUATION_FILE
    out: dict[str, dict[str, Example]] = {}
    loaded: dict[str, dict[str, Example]] = {}
    for name in sorted(names):
        base = next((name[: -len(s)] for s in SUFFIXES if name.endswith(s)), name)
        if base not in loaded:
            try:
                loaded[base] = {ex.id: ex for ex in load_examples(cfg, base)}
            except (ValueError, FileNotFoundError, KeyError) as exc:
                raise ValueError(
                    f"{path}: config: the examples of {base!r} cannot be loaded ({exc}); pass --dataset_root DIR "
                    "(the shapes world) or --no_examples"
                ) from None
        out[name] = loaded[base]
    return out


# The fields the page reads from a prediction row, and what each must be; others are not read.
ROW_FIELDS: dict[str, Any] = {
    "policy": str,
    "mode": str,
    "dataset": str,
    "seed": int,
    "example_id": str,
    "status": str,
    "program": str | None,
    "error": str | None,
    "refused": bool | None,
    "unit_test_score": float | None,
    "tool_calls": list[dict[str, Any]] | None,
}
REQUIRED = ("policy", "mode", "dataset", "seed", "example_id", "status")


def read_predictions(folder: Path) -> list[dict[str, Any]]:
    path = folder / PREDICTIONS_FILE
    rows = []
    for lineno, row in read_jsonl(path):
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise ValueError(f"{path}:{lineno}: missing field(s) {missing}")
        for key, hint in ROW_FIELDS.items():
            problem = mismatch(row.get(key), hint) if key in row else None
            if problem:
                raise ValueError(f"{path}:{lineno}: {key}: expected {problem}, got {type(row[key]).__name__}")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no predictions")
    return rows


def read_evaluation(
    folder: Path,
    pictures: Pictures | None,
    limit: int,
    seed: int,
    before: str | None = None,
    after: str | None = None,
    shapes_root: str | None = None,
    use_examples: bool = True,
) -> EvalData:
    rows = read_predictions(folder)
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    before = before or policies[0]
    after = after or (policies[1] if len(policies) > 1 else policies[0])
    for label, name in (("--before", before), ("--after", after)):
        if name not in policies:
            raise ValueError(f"{label}: no policy {name!r} in {folder / PREDICTIONS_FILE}; it has {policies}")
    examples = {}
    if use_examples:
        cfg = saved_config(folder, shapes_root)
        if pictures is not None:
            pictures.allow(*eval_roots(folder, cfg))
        examples = eval_examples(folder, cfg, {r["dataset"] for r in rows})

    by_key: dict[tuple, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r["policy"] in (before, after):
            by_key.setdefault((r["mode"], r["dataset"], r["seed"], r["example_id"]), {})[r["policy"]] = r
    keys = list(by_key)
    verdicts = {k: _kind(by_key[k], before, after, examples.get(k[1], {}).get(k[3])) for k in keys}
    changed = [k for k in keys if verdicts[k] in ("fixed", "broken")]
    rest = [k for k in keys if verdicts[k] not in ("fixed", "broken")]
    random.Random(seed).shuffle(rest)
    shown = (changed + rest)[:limit] if len(keys) > limit else keys
    order = {k: i for i, k in enumerate(keys)}
    shown.sort(key=order.__getitem__)

    cards: list[dict[str, Any]] = []
    pairs: list[dict[str, Any]] = []
    for key in shown:
        mode, dataset, run_seed, example_id = key
        example = examples.get(dataset, {}).get(example_id)
        slot = {}
        for policy in (before, after):
            r = by_key[key].get(policy)
            if r is None:
                continue
            slot[policy] = len(cards)
            cards.append(_card(r, example, pictures, len(pairs)))
        pairs.append({"k": verdicts[key], "a": slot.get(before), "b": slot.get(after), "mode": mode, "seed": run_seed})
    notes = []
    if not any(c["calls"] for c in cards):
        notes.append("predictions.jsonl records no tool-call traces: only answer and gold boxes are drawn")
    return EvalData(cards, pairs, (before, after), len(keys), dict(Counter(verdicts.values())), notes)


def _kind(slot: dict[str, dict[str, Any]], before: str, after: str, example: Example | None) -> str:
    verdicts = []
    for policy in (before, after):
        r = slot.get(policy)
        verdicts.append(None if r is None else right(example, r["status"], _final(r)))
    a, b = verdicts
    if a is None or b is None:
        return "unknown"
    return {(False, True): "fixed", (True, False): "broken", (True, True): "both_right"}.get((a, b), "both_wrong")


def _final(row: dict[str, Any]) -> Any:
    """The answer the no-fallback metrics score (a refused program answers nothing)."""
    return None if row.get("refused") else row.get("answer")


def _card(row: dict[str, Any], example: Example | None, pictures: Pictures | None, pair: int) -> dict[str, Any]:
    calls = row.get("tool_calls") if isinstance(row.get("tool_calls"), list) else []
    extra = {
        "example_id": row["example_id"],
        "s": None,
        "q": example.query if example else "",
        "ds": row["dataset"],
        "task": example.task if example else "",
        "fam": example.group if example else "",
        "pol": row["policy"],
        "mode": row["mode"],
        "seed": row["seed"],
        "tot": None,
        "comp": {} if row.get("unit_test_score") is None else {"unit_tests": row["unit_test_score"]},
        "adv": None,
        "g": pair,
    }
    if "tool_calls" not in row:
        extra["nt"] = True
    if row.get("fallback_answer") is not None:
        extra["fb"] = str(row["fallback_answer"])
    return make_card(
        pictures=pictures,
        example=example,
        program=str(row.get("program") or ""),
        status=str(row["status"]),
        answer=_final(row),
        error=row.get("error"),
        calls=calls,
        extra=extra,
    )
