"""A run folder as page data: the curves of every rollout, and the cards of a sample of groups.

`rollouts.jsonl` of a long run holds hundreds of thousands of rows. It is read in one pass that
keeps a few fields per row (step, example, reward, status, whether the answer was right, where
the line starts); the curves and the groups' advantages come from those. Then a sample of groups
is drawn evenly across steps and only those rows are read again in full, checked against
`RolloutRow` (a bad row is an error naming the file and line), and turned into cards.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vprl.data.records import Example
from vprl.train.rollouts.log import ROLLOUTS_FILE, RolloutRow
from vprl.train.runs.folder import CONFIG_FILE, read_config
from vprl.train.view.cards import EXCEPTIONS, make_card, right
from vprl.train.view.episodes import attach_turns
from vprl.train.view.images import Pictures


@dataclass
class Row:
    """What the first pass keeps of one rollout."""

    step: int
    example_id: str
    policy: str
    total: float | None
    status: str
    right: bool | None
    offset: int
    lineno: int


@dataclass
class RunData:
    cards: list[dict[str, Any]]
    groups: list[dict[str, Any]]
    curves: dict[str, list[Any]]
    total_rows: int
    total_groups: int
    eligible_groups: int  # those of the chosen steps, the sample is drawn from them
    components: list[str]
    notes: list[str] = field(default_factory=list)


def data_keys(config: dict[str, Any], dataset_root: str | None) -> dict[str, Any]:
    """The run's recipe keys that say where its examples are; `--dataset_root` replaces its root."""
    from vprl.train.recipe.sections import DataArgs

    keys = {name: config[name] for name in DataArgs.__dataclass_fields__ if name in config}
    if dataset_root:
        keys["dataset_root"] = dataset_root
    return keys


def run_examples(run: Path, config: dict[str, Any], dataset_root: str | None) -> dict[str, Example]:
    """The run's examples by id, loaded as the run loaded them (its recipe's data keys)."""
    from vprl.train.recipe.data import load_examples
    from vprl.train.recipe.sections import DataArgs

    keys = data_keys(config, dataset_root)
    if not keys.get("dataset_root"):
        raise ValueError(f"{run / CONFIG_FILE}: dataset_root: not set; pass --dataset_root (or --no_examples)")
    try:
        examples = load_examples(DataArgs(**keys))
    except ValueError as exc:
        raise ValueError(
            f"{run / CONFIG_FILE}: dataset_root: the run's examples cannot be loaded ({exc}); "
            "pass --dataset_root DIR where they are now, or --no_examples"
        ) from None
    return {ex.id: ex for ex in examples}


def recipe_roots(run: Path, config: dict[str, Any], dataset_root: str | None) -> list[str]:
    """The folders the run's recipe reads images from: its `dataset_root`, each mixture entry's
    root, any loader's `images_dir` and a reward's `cache_dir`. Images named by the rows are read
    only under these (and the run folder)."""
    from vprl.train.recipe.data import entry_args
    from vprl.train.recipe.mixture import as_mixture
    from vprl.train.recipe.parsing import structured
    from vprl.train.recipe.sections import DataArgs

    keys = data_keys(config, dataset_root)
    try:
        args = DataArgs(**keys)
        mixture = as_mixture(args.dataset_mixture)
        each = [args] if mixture is None else [entry_args(e, args) for e in mixture.datasets]
        rewards = structured(config.get("rewards"), "rewards", list) or []
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{run / CONFIG_FILE}: the run's dataset keys cannot be read ({exc})") from None
    roots = [args.dataset_root]
    for one in each:
        options = one.dataset_options if isinstance(one.dataset_options, dict) else {}
        roots += [one.dataset_root, options.get("images_dir")]
    for spec in rewards:  # a reward keeping its files elsewhere (the unit tests' cache_dir)
        settings = spec.get("settings") if isinstance(spec, dict) else None
        roots.append(settings.get("cache_dir") if isinstance(settings, dict) else None)
    return [str(r) for r in roots if isinstance(r, str | Path) and str(r)]


def scan(path: Path, examples: dict[str, Example]) -> list[Row]:
    """First pass: a `Row` per rollout, streaming. A torn last line (a run killed mid-write) is dropped."""
    rows: list[Row] = []
    offset = 0
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(_row(json.loads(line), examples, offset, lineno))
                except (json.JSONDecodeError, UnicodeDecodeError, TypeError, ValueError) as exc:
                    if line.endswith(b"\n"):
                        raise ValueError(f"{path}:{lineno}: {exc}") from None
                    warnings.warn(f"{path}:{lineno}: dropping a torn last line ({exc})", stacklevel=2)
            offset += len(line)
    return rows


def _row(raw: Any, examples: dict[str, Example], offset: int, lineno: int) -> Row:
    if not isinstance(raw, dict):
        raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
    step, example_id, status, total = raw.get("step"), raw.get("example_id"), raw.get("status"), raw.get("total")
    if type(step) is not int or not isinstance(example_id, str) or not isinstance(status, str):
        raise ValueError("step (int), example_id and status (str) are required")
    if total is not None and not isinstance(total, int | float):
        raise ValueError(f"total: expected a number or null, got {type(total).__name__}")
    components = raw.get("components") if isinstance(raw.get("components"), dict) else None
    verdict = right(examples.get(example_id), status, raw.get("answer"), components)
    return Row(step, example_id, str(raw.get("policy") or ""), total, status, verdict, offset, lineno)


def curves(rows: list[Row]) -> dict[str, list[Any]]:
    """Per step, over every rollout: mean reward, accuracy, exception rate, rollouts."""
    by_step: dict[int, list[Row]] = defaultdict(list)
    for r in rows:
        by_step[r.step].append(r)
    out: dict[str, list[Any]] = {"step": [], "reward": [], "accuracy": [], "exceptions": [], "n": []}
    for step in sorted(by_step):
        rs = by_step[step]
        totals = [r.total for r in rs if r.total is not None]
        verdicts = [r.right for r in rs if r.right is not None]
        out["step"].append(step)
        out["reward"].append(round(statistics.fmean(totals), 4) if totals else None)
        out["accuracy"].append(round(sum(verdicts) / len(verdicts), 4) if verdicts else None)
        out["exceptions"].append(round(sum(r.status in EXCEPTIONS for r in rs) / len(rs), 4))
        out["n"].append(len(rs))
    return out


def groups_of(rows: list[Row], size: int) -> list[list[int]]:
    """The G samples of one prompt: rows of one step, example and policy, in file order, cut into
    runs of `size` (an example drawn twice in one step makes two groups)."""
    keyed: dict[tuple[int, str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        keyed[(r.step, r.example_id, r.policy)].append(i)
    out = []
    for members in keyed.values():
        step = size if size > 0 else len(members)
        out += [members[i : i + step] for i in range(0, len(members), step)]
    return out


def advantages(totals: list[float | None], algorithm: str, scale: Any) -> list[float | None]:
    """Each sample's advantage as trl computes it from the group's rewards (masked rewards excluded):
    GRPO `(r - mean) / (std + 1e-4)` (std unscaled when `scale_rewards` is none/false), RLOO
    `r - mean of the others`; ReST has none."""
    known = [t for t in totals if t is not None]
    if algorithm not in ("grpo", "rloo") or not known:
        return [None] * len(totals)
    mean = statistics.fmean(known)
    if algorithm == "rloo":
        n = len(known)
        return [None if t is None else (t - (sum(known) - t) / (n - 1) if n > 1 else 0.0) for t in totals]
    std = statistics.stdev(known) if len(known) > 1 else 0.0
    scaled = str(scale).lower() not in ("none", "false")
    return [None if t is None else (t - mean) / (std + 1e-4) if scaled else t - mean for t in totals]


def pick_groups(groups: list[list[int]], rows: list[Row], limit: int, seed: int) -> list[list[int]]:
    """At most `limit` groups, drawn evenly across steps (round robin over the steps, in a shuffled
    order within each), returned in step order."""
    if len(groups) <= limit:
        return groups
    rng = random.Random(seed)
    by_step: dict[int, list[list[int]]] = defaultdict(list)
    for g in groups:
        by_step[rows[g[0]].step].append(g)
    queues = []
    for step in sorted(by_step):
        bucket = by_step[step][:]
        rng.shuffle(bucket)
        queues.append(bucket)
    picked: list[list[int]] = []
    while len(picked) < limit:
        for q in queues:
            if q and len(picked) < limit:
                picked.append(q.pop())
    return sorted(picked, key=lambda g: (rows[g[0]].step, g[0]))


def read_run(
    run: Path,
    pictures: Pictures | None,
    limit: int,
    seed: int,
    steps: tuple[int, int] | None = None,
    dataset_root: str | None = None,
    use_examples: bool = True,
) -> RunData:
    path = run / ROLLOUTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run}: no {ROLLOUTS_FILE} (not a run folder)")
    config = read_config(run)
    if pictures is not None:
        pictures.allow(*recipe_roots(run, config, dataset_root))
    examples = run_examples(run, config, dataset_root) if use_examples else {}
    rows = scan(path, examples)
    if not rows:
        raise ValueError(f"{path}: no rollouts")
    groups = groups_of(rows, int(config.get("num_generations") or 0))
    total_groups = len(groups)
    if steps is not None:
        groups = [g for g in groups if steps[0] <= rows[g[0]].step <= steps[1]]
    chosen = pick_groups(groups, rows, limit, seed)
    algorithm, scale = str(config.get("algorithm", "")), config.get("scale_rewards", "group")
    traced = config.get("rollout_traces", True) is not False
    cards: list[dict[str, Any]] = []
    out_groups: list[dict[str, Any]] = []
    with open(path, "rb") as fh:
        for members in chosen:
            advs = advantages([rows[i].total for i in members], algorithm, scale)
            first = len(cards)
            for i, adv in zip(members, advs):
                full = _read_row(fh, rows[i], path)
                card = _card(full, examples.get(full.example_id), pictures, adv, len(out_groups))
                if not traced:
                    card["nt"] = True
                cards.append(card)
            head = rows[members[0]]
            out_groups.append({"s": head.step, "e": head.example_id, "cards": list(range(first, len(cards)))})
    repaired = attach_turns(cards, run)
    components = sorted({name for c in cards for name in c["comp"]})
    notes = [] if traced else ["the run kept no tool-call traces (rollout_traces: false): no boxes to draw"]
    if any(c["calls"] for c in cards) and not any(
        call["line"] is not None and not call["inf"] for c in cards for call in c["calls"]
    ):
        notes.append("program lines of tool calls are matched from the source (the trace does not record them)")
    if repaired:
        notes.append(
            f"{repaired} of the programs shown ended a repair episode: their earlier turns are on their cards"
        )
    return RunData(cards, out_groups, curves(rows), len(rows), total_groups, len(groups), components, notes)


def _read_row(fh, row: Row, path: Path) -> RolloutRow:
    fh.seek(row.offset)
    where = f"{path}:{row.lineno}"
    try:
        return RolloutRow.from_json(json.loads(fh.readline()), where)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None


def _card(row: RolloutRow, example: Example | None, pictures: Pictures | None, adv: float | None, group: int):
    extra = {
        "example_id": row.example_id,
        "s": row.step,
        "q": row.query or (example.query if example else ""),
        "ds": row.dataset,
        "task": row.task,
        "fam": row.group,
        "pol": row.policy,
        "tot": row.total,
        "comp": row.components,
        "adv": None if adv is None or not math.isfinite(adv) else round(adv, 3),
        "g": group,
    }
    if row.unit_tests:
        extra["ut"] = [_unit_test(t, pictures) for t in row.unit_tests]
    return make_card(
        pictures=pictures,
        example=example,
        program=row.program,
        status=row.status,
        answer=row.answer,
        error=row.error,
        calls=row.tool_calls,
        extra=extra,
        components=row.components,
    )


def _unit_test(outcome: dict[str, Any], pictures: Pictures | None) -> dict[str, Any]:
    image = outcome.get("image")
    img = pictures.index(image) if pictures is not None and isinstance(image, str) else None
    return {
        "cap": outcome.get("caption"),
        "exp": outcome.get("expected"),
        "st": outcome.get("status"),
        "ans": outcome.get("answer"),
        "sc": outcome.get("score"),
        "img": img,
        "noimg": pictures.problem(image) if pictures is not None else None,
    }
