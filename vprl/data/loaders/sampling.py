"""The papers' sampling recipes, deterministic given a seed, with stable split ids for manifests.

How items are picked: every Example gets the rank `sha256(f"{seed}:{id}")`, and a recipe takes the
lowest-ranked items inside each stratum. The choice therefore depends only on the seed and the ids
in that stratum: not on file order, not on Python's hash seed, and not on other strata (adding a
GQA group leaves the others' picks unchanged). Strata with too few items are taken whole, as
ViUniT does for small GQA groups (`typeVerifyC`, `stateChoose`, ...).

Recipes (counts from ViUniT, [U] A and F.4.2; docs/references.md#datasets-and-metrics):

* GQA: `gqa_eval_sample` 5 per question family (`types.detailed`) from balanced-val (502 in the
  paper); `gqa_train_sample` 10 per family from balanced-train (1022).
* SugarCREPE: `sugarcrepe_splits` -> 40 entries per category for evaluation (x2 items, 560), and a
  training subset of `train_fraction` (10%) of the remaining entries, spread equally over the 7
  categories (a category with too few entries left is taken whole; its shortfall is not moved
  to others, which would unbalance the set). Entries (positive + hard negative) are never split.
  The paper's 788 is not derivable from its stated rule; this is our reading.
* VQAv2: `vqav2_sample` 10 questions for each of the 50 most common `multiple_choice_answer`s
  (ties broken by answer text). The paper draws from the validation part of Selvaraju et al.'s
  compositional subset; pass that pool if you have it, otherwise the full val split.
* OK-VQA: `okvqa_sample` 10 per question type (11 types -> 110).

Each recipe returns a `Sample`: the Examples, plus `split_id` (recipe name + a hash of the sorted
selected ids) for run manifests, so two runs can check they used the same items.

Mixtures (`mixture_rows`, `repeat_rows`): the rows of one epoch of a weighted mixture of datasets,
each dataset's examples repeated in seeded rank order until its rows make its share of the epoch.

`cached_sample` keeps a drawn sample on disk: GQA's balanced-train file holds 943k questions and
every training process needs the same 1,022 of them, so the first process to arrive parses the file
and draws, and the other processes (and later runs) read what it drew.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vprl.data.records import Example


@dataclass(frozen=True)
class Sample:
    name: str
    examples: list[Example]
    seed: int
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def ids(self) -> list[str]:
        return [ex.id for ex in self.examples]

    @property
    def split_id(self) -> str:
        return split_id(self.name, self.ids)

    def manifest(self) -> dict[str, Any]:
        """JSON-ready record of what was sampled and how."""
        counts = Counter(ex.group for ex in self.examples)
        return {
            "name": self.name,
            "split_id": self.split_id,
            "seed": self.seed,
            "params": dict(self.params),
            "n": len(self.examples),
            "per_group": dict(sorted(counts.items())),
            "ids": self.ids,
        }


def split_id(name: str, ids: Sequence[str]) -> str:
    """`<name>-<12 hex>`: a hash of the sorted ids, independent of their order."""
    digest = hashlib.sha256("\n".join(sorted(ids)).encode("utf-8")).hexdigest()
    return f"{name}-{digest[:12]}"


def rank(seed: int, key: str) -> str:
    """The seeded sort key of one item; lower ranks are picked first."""
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()


def _check_unique(examples: Sequence[Example]) -> None:
    dupes = [i for i, n in Counter(ex.id for ex in examples).items() if n > 1]
    if dupes:
        raise ValueError(f"duplicate Example ids in the pool, e.g. {dupes[:5]}; sampling needs unique ids")


def _stratify(examples: Sequence[Example], key: Callable[[Example], str], what: str) -> dict[str, list[Example]]:
    strata: dict[str, list[Example]] = defaultdict(list)
    for ex in examples:
        k = key(ex)
        if not k:
            raise ValueError(f"example {ex.id!r} has no {what}; cannot sample per {what}")
        strata[k].append(ex)
    return strata


def sample_per_group(
    examples: Sequence[Example],
    k: int,
    seed: int,
    *,
    key: Callable[[Example], str] = lambda ex: ex.group,
    name: str = "per-group",
) -> Sample:
    """Up to `k` items per stratum (default: `Example.group`), ordered by stratum then rank."""
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    _check_unique(examples)
    picked: list[Example] = []
    for _, items in sorted(_stratify(examples, key, "group").items()):
        picked.extend(sorted(items, key=lambda ex: rank(seed, ex.id))[:k])
    return Sample(name, picked, seed, {"k": k})


def gqa_eval_sample(examples: Sequence[Example], seed: int = 0, per_group: int = 5) -> Sample:
    """ViUniT's GQA evaluation set: `per_group` per question family from balanced-val."""
    return sample_per_group(examples, per_group, seed, name=f"gqa-eval-{per_group}pg-s{seed}")


def gqa_train_sample(examples: Sequence[Example], seed: int = 0, per_group: int = 10) -> Sample:
    """ViUniT's GQA training set: `per_group` per question family from balanced-train."""
    return sample_per_group(examples, per_group, seed, name=f"gqa-train-{per_group}pg-s{seed}")


def okvqa_sample(examples: Sequence[Example], seed: int = 0, per_type: int = 10) -> Sample:
    """`per_type` questions per OK-VQA question type."""
    return sample_per_group(examples, per_type, seed, name=f"okvqa-{per_type}pt-s{seed}")


def vqav2_sample(examples: Sequence[Example], seed: int = 0, n_answers: int = 50, per_answer: int = 10) -> Sample:
    """`per_answer` questions for each of the `n_answers` most common `multiple_choice_answer`s."""

    def answer(ex: Example) -> str:
        if "multiple_choice_answer" not in ex.meta:
            raise ValueError(f"example {ex.id!r} has no meta['multiple_choice_answer'] (unannotated split?)")
        return str(ex.meta["multiple_choice_answer"])

    counts = Counter(answer(ex) for ex in examples)
    if len(counts) < n_answers:
        raise ValueError(f"the pool has only {len(counts)} distinct answers, fewer than n_answers={n_answers}")
    top = {a for a, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n_answers]}
    pool = [ex for ex in examples if answer(ex) in top]
    sample = sample_per_group(pool, per_answer, seed, key=answer, name=f"vqav2-top{n_answers}x{per_answer}-s{seed}")
    return Sample(sample.name, sample.examples, seed, {"n_answers": n_answers, "per_answer": per_answer})


def _entries(examples: Sequence[Example]) -> dict[str, dict[str, list[Example]]]:
    """category -> entry key -> its items (positive and negative)."""
    out: dict[str, dict[str, list[Example]]] = defaultdict(lambda: defaultdict(list))
    for ex in examples:
        entry = ex.meta.get("entry")
        if not entry or not ex.group:
            raise ValueError(f"example {ex.id!r} lacks meta['entry'] or group; is it a SugarCREPE item?")
        out[ex.group][str(entry)].append(ex)
    return out


def sugarcrepe_splits(
    examples: Sequence[Example], seed: int = 0, eval_per_category: int = 40, train_fraction: float = 0.10
) -> tuple[Sample, Sample]:
    """(train, eval) over whole entries: eval takes `eval_per_category` entries per category; train
    takes `train_fraction` of the remaining entries, split equally over categories. Disjoint."""
    if not 0 < train_fraction <= 1:
        raise ValueError(f"train_fraction must be in (0, 1], got {train_fraction}")
    _check_unique(examples)
    cats = _entries(examples)
    eval_items: list[Example] = []
    remaining: dict[str, list[str]] = {}
    for cat, entries in sorted(cats.items()):
        ordered = sorted(entries, key=lambda e: rank(seed, e))
        for e in ordered[:eval_per_category]:
            eval_items.extend(entries[e])
        remaining[cat] = ordered[eval_per_category:]
    target = round(train_fraction * sum(len(v) for v in remaining.values()))
    base, extra = divmod(target, len(remaining))
    train_items: list[Example] = []
    for i, (cat, ordered) in enumerate(sorted(remaining.items())):
        quota = base + (1 if i < extra else 0)
        for e in ordered[:quota]:  # already in seeded rank order, after the eval picks
            train_items.extend(cats[cat][e])
    params = {"eval_per_category": eval_per_category, "train_fraction": train_fraction}
    return (
        Sample(f"sugarcrepe-train-{train_fraction:g}-s{seed}", train_items, seed, params),
        Sample(f"sugarcrepe-eval-{eval_per_category}pc-s{seed}", eval_items, seed, params),
    )


def refcoco_train_sample(examples: Sequence[Example], seed: int = 0, per_category: int = 10) -> Sample:
    """`per_category` referring expressions per target category (`Example.group`) from a RefCOCO
    training split: 800 for RefCOCO's 80 categories, a training set the size of GQA's 1,022."""
    sample = sample_per_group(examples, per_category, seed, name=f"refcoco-train-{per_category}pc-s{seed}")
    return Sample(sample.name, sample.examples, seed, {"per_category": per_category})


def sugarcrepe_train_sample(examples: Sequence[Example], seed: int = 0, train_fraction: float = 0.10) -> Sample:
    """The training part of `sugarcrepe_splits` (entries left after the evaluation picks)."""
    return sugarcrepe_splits(examples, seed, train_fraction=train_fraction)[0]


# One epoch's rows are held as a list: past this many, a weight is a typo (1e-7 for 1e-1), not a plan,
# and the list would take gigabytes before the first step.
MAX_EPOCH_ROWS = 10_000_000


class EpochTooLong(ValueError):
    """Drawing every example of dataset `index` at its share needs an epoch of `length` rows."""

    def __init__(self, index: int, share: float, size: int, length: float):
        self.index, self.share, self.size, self.length = index, share, size, length
        super().__init__(
            f"its share of the draws, {share:.3g}, needs an epoch of {length:.3g} rows to draw each of its {size} "
            f"examples once (at most {MAX_EPOCH_ROWS:,}); raise its weight or drop the dataset"
        )


def mixture_rows(sizes: Sequence[int], weights: Sequence[float]) -> list[int]:
    """Rows per dataset in one epoch of a weighted mixture: shares proportional to `weights`, and the
    epoch just long enough that every dataset fills at least its own size, so that every example is
    drawn at least once per epoch and a small dataset with a large weight is repeated. An epoch past
    `MAX_EPOCH_ROWS` raises `EpochTooLong` naming the dataset whose share asks for it."""
    if len(sizes) != len(weights) or not sizes:
        raise ValueError(f"mixture_rows: {len(sizes)} sizes for {len(weights)} weights")
    if any(n < 1 for n in sizes) or any(not (w > 0 and math.isfinite(w)) for w in weights):
        raise ValueError(
            f"mixture_rows: sizes must be positive and weights positive and finite, got {sizes}, {weights}"
        )
    total = sum(weights)
    shares = [w / total for w in weights]
    # A share that underflows to 0 asks for an endless epoch, as does one whose quotient overflows.
    needed = [n / s if s > 0 else math.inf for n, s in zip(sizes, shares, strict=True)]
    worst = max(range(len(sizes)), key=needed.__getitem__)
    if needed[worst] > MAX_EPOCH_ROWS:
        raise EpochTooLong(worst, shares[worst], sizes[worst], needed[worst])
    length = max(math.ceil(x - 1e-9) for x in needed)
    return [max(n, round(s * length)) for n, s in zip(sizes, shares, strict=True)]


def repeat_rows(examples: Sequence[Example], rows: int, seed: int, salt: str = "") -> list[Example]:
    """`rows` draws from `examples`: each example `rows // n` times, and the lowest-ranked
    `rows % n` once more (rank: `rank(seed, salt + id)`), so no example is drawn twice more often
    than another."""
    if not examples:
        raise ValueError("repeat_rows: no examples to draw from")
    ordered = sorted(examples, key=lambda ex: rank(seed, salt + ex.id))
    whole, rest = divmod(rows, len(ordered))
    return ordered * whole + ordered[:rest]


# Bumped when what a cached sample holds changes meaning; the code of the loaders and of this module
# is part of the key too (`cached_sample`'s `code`), so an edit there is never served stale samples.
CACHE_FORMAT = 1


def _file_identity(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def cached_sample(
    draw: Callable[[], Sample],
    cache_dir: str | Path,
    *,
    recipe: dict[str, Any],
    sources: Sequence[str | Path],
    code: Sequence[str | Path] = (),
) -> Sample:
    """`draw()`'s sample, drawn once for all processes and runs that ask for the same one.

    The key is `recipe` (what is drawn and how: dataset, split, loader options, sample recipe, seed),
    the size and modification time of each file in `sources` (what it is drawn from) and the bytes of
    each file in `code` (what reads and draws it). The first caller to take the lock draws and writes
    `<cache_dir>/<name>.jsonl`; callers waiting on the lock then read it. A file that does not hold
    the key it is named for is drawn again and replaced."""
    key = {
        "format": CACHE_FORMAT,
        "recipe": recipe,
        "sources": [_file_identity(Path(s)) for s in sources],
        "code": [hashlib.sha256(Path(c).read_bytes()).hexdigest() for c in code],
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    cache_dir = Path(cache_dir).expanduser()
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"sample-{digest}.jsonl"
    with open(cache_dir / f"sample-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held until the file is closed
        found = _read_sample(path, key)
        if found is not None:
            return found
        sample = draw()
        header = {"key": key, "name": sample.name, "seed": sample.seed, "params": sample.params}
        lines = [json.dumps(header), *(json.dumps(ex.to_json()) for ex in sample.examples)]
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.replace(partial, path)  # a reader never sees half a file, even without the lock
        return sample


def _read_sample(path: Path, key: dict[str, Any]) -> Sample | None:
    """The sample stored at `path` when it was stored under `key`; None when absent or another."""
    if not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        header = json.loads(lines[0]) if lines else {}
    except json.JSONDecodeError:
        return None
    if header.get("key") != key:
        return None
    examples = [Example.from_json(json.loads(line), f"{path}:{i}") for i, line in enumerate(lines[1:], 2)]
    return Sample(header["name"], examples, header["seed"], header["params"])
