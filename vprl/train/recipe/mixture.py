"""Dataset mixtures: several datasets in one recipe, each with its weight, task, prompt, rewards and
labels, following open-r1's `dataset_mixture` where it fits.

```yaml
dataset_root: runs/tiny_policy/world  # entries' roots are relative to it
dataset_mixture:
  seed: 0                             # of the draws (which examples repeat)
  datasets:
    - {name: vqa, dataset: shapes, tasks: [train], weight: 0.5}
    - name: itm
      dataset: shapes
      tasks: [winoground, sugarcrepe]
      weight: 0.5
      labels: false                   # the answers are withheld at load time
      rewards: [unit_tests]           # which of the recipe's rewards score this entry (default: all)
      prompt: {layout: bare}          # PromptConfig fields over the recipe's prompt_* keys
```

What differs from open-r1: `dataset` names a loader (or `shapes`), not a hub id; there are no
`columns` (an entry's prompt template decides what of an example is shown); and `weight` is the
entry's share of the draws, not the fraction of the dataset kept, because the datasets of a
transfer experiment differ in size by orders of magnitude and the share is what it varies. One
epoch of a mixture is the shortest list of rows in which the shares are the weights and every
example appears at least once (`vprl.data.loaders.sampling.mixture_rows`); trl's sampler shuffles it,
so each batch holds every entry in its share in expectation.

An entry holds one task: its examples get one prompt template (the signature is the task's) and
the rewards named for it. An entry with `labels: false` is loaded, sampled, and then stripped of
everything that carries its answers (`withhold_labels`) before the recipe sees it, so nothing
downstream, the rewards included, can read them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vprl.data.records import Example
from vprl.data.typed import check_row
from vprl.train.recipe.parsing import ConfigError

KEY = "dataset_mixture"
ENTRY_META = "mixture_entry"  # Example.meta key naming the entry an example was drawn from
LABEL_READING_REWARDS = frozenset({"correctness"})
# Meta keys that say where a question comes from or what the executor needs to run its program,
# never what its answer is. Every other key a loader keeps may carry the answer: GQA's fullAnswer
# and annotations, SugarCREPE's polarity, Winoground's image and caption indices, RefCOCO's bbox,
# VQAv2's multiple_choice_answer, NExT-QA's answer_index.
UNLABELED_META = frozenset(
    {
        "imageId", "questionId", "types", "isBalanced",  # GQA
        "question_id", "image_id", "question_type",  # VQAv2, OK-VQA
        "tag", "category", "entry",  # Winoground, SugarCREPE (the entry holds both captions)
        "video", "videoId", "qid", "type", "num_frames", "possible_answers", "options",  # NExT-QA
    }
)  # fmt: skip
_NAME = re.compile(r"^[A-Za-z0-9_.:+-]+$")  # an entry's name becomes part of metric names


@dataclass
class MixtureEntry:
    """One dataset of a mixture; the keys are the recipe's `dataset_*` keys without the prefix."""

    dataset: str
    name: str = ""
    root: str | None = None
    split: str | None = None
    tasks: list[str] | None = None
    sample: str | None = None
    sample_seed: int | None = None
    limit: int | None = None
    options: dict[str, Any] | None = None
    weight: float = 1.0
    labels: bool = True
    rewards: list[str] | None = None
    prompt: dict[str, Any] | None = None


@dataclass
class Mixture:
    datasets: list[MixtureEntry]
    seed: int = 0


def parse_mixture(value: Any, where: str) -> Mixture:
    """A `dataset_mixture` mapping as a `Mixture`; a bad key or value is a ConfigError naming
    `where` (the recipe's file:line) and the key's path."""
    at = f"{where}: {KEY}"
    if not isinstance(value, Mapping):
        raise ConfigError(f"{at}: expected a mapping with `datasets` (and `seed`), got {type(value).__name__}")
    try:
        check_row(Mixture, dict(value), at, required=("datasets",))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    rows = value["datasets"]
    if not rows:
        raise ConfigError(f"{at}.datasets: at least one dataset is needed")
    entries = [_entry(row, f"{at}.datasets[{i}]") for i, row in enumerate(rows)]
    names = [e.name for e in entries]
    twice = sorted(n for n, c in Counter(names).items() if c > 1)
    if twice:
        raise ConfigError(f"{at}.datasets: each entry needs its own name; {twice} appear twice (set `name`)")
    return Mixture(entries, int(value.get("seed", 0)))


def _entry(row: Any, at: str) -> MixtureEntry:
    if not isinstance(row, Mapping):
        raise ConfigError(f"{at}: expected a mapping (dataset, weight, ...), got {type(row).__name__} {row!r:.60}")
    given = {k: v for k, v in row.items() if v is not None}
    try:
        check_row(MixtureEntry, given, at, required=("dataset",))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    entry = MixtureEntry(**given)
    if isinstance(entry.weight, bool) or not (entry.weight > 0 and math.isfinite(entry.weight)):
        raise ConfigError(f"{at}.weight: must be a positive number, got {entry.weight!r} (drop the entry instead)")
    for key in ("limit", "sample_seed"):
        value = getattr(entry, key)
        if value is not None and (value < 0 or (key == "limit" and value < 1)):
            raise ConfigError(f"{at}.{key}: must be {'positive' if key == 'limit' else '>= 0'}, got {value}")
    if entry.tasks is not None and entry.dataset != "shapes":
        raise ConfigError(f"{at}.tasks: only shapes-world entries take tasks ({entry.dataset!r} takes a split)")
    if entry.rewards is not None and not entry.rewards:
        raise ConfigError(f"{at}.rewards: an entry needs at least one reward (leave it out for all of them)")
    if not entry.name:
        entry.name = default_name(entry)
    if not _NAME.match(entry.name):
        raise ConfigError(f"{at}.name: {entry.name!r} may hold only letters, digits and _ . : + -")
    return entry


def default_name(entry: MixtureEntry) -> str:
    if entry.dataset == "shapes":
        return "shapes:" + "+".join(entry.tasks or ["train"])
    return entry.dataset + (f":{entry.split}" if entry.split else "")


def as_mixture(value: Any, where: str = "recipe") -> Mixture | None:
    """`DataArgs.dataset_mixture` as a `Mixture`: parsed already, or as a run's config.yaml holds it."""
    if value is None or isinstance(value, Mixture):
        return value
    return parse_mixture(value, where)


# --- withholding labels ------------------------------------------------------------------------
def withhold_labels(example: Example) -> Example:
    """`example` as a label-free run sees it: no answers, no box, only `UNLABELED_META`, an id that
    does not spell the answer (SugarCREPE's ids end in -pos/-neg, Winoground's name the image and
    caption indices) and, for grounding, no group (RefCOCO's is the target's category)."""
    digest = hashlib.sha256(example.id.encode("utf-8")).hexdigest()[:16]
    return Example(
        id=f"{example.dataset}-q{digest}",
        dataset=example.dataset,
        task=example.task,
        query=example.query,
        image=example.image,
        group="" if example.task == "grounding" else example.group,
        meta={k: v for k, v in example.meta.items() if k in UNLABELED_META},
    )


def has_labels(example: Example) -> bool:
    return bool(example.answers) or example.box is not None


# --- the loaded mixture -------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadedEntry:
    entry: MixtureEntry
    task: str
    examples: list[Example]  # each once, stamped with the entry's name
    share: float  # the entry's weight over the mixture's total
    rows: int  # times its examples are drawn per epoch

    def record(self) -> dict[str, Any]:
        from vprl.data.loaders.sampling import split_id

        return {
            **dataclasses.asdict(self.entry),
            "task": self.task,
            "share": round(self.share, 6),
            "examples": len(self.examples),
            "rows": self.rows,
            "split_id": split_id(self.entry.name, [ex.id for ex in self.examples]),
        }


@dataclass(frozen=True)
class LoadedMixture:
    seed: int
    entries: list[LoadedEntry]
    drawn: list[Example] = field(repr=False)  # one epoch's rows, in a seeded order

    @property
    def examples(self) -> list[Example]:
        return [ex for e in self.entries for ex in e.examples]

    def entry(self, name: str) -> LoadedEntry:
        return next(e for e in self.entries if e.entry.name == name)


def assemble(mixture: Mixture, loaded: Sequence[tuple[MixtureEntry, list[Example]]], where: str) -> LoadedMixture:
    """Each entry's examples (as its loader gave them) stripped or stamped, then drawn by weight."""
    from vprl.data.loaders.sampling import mixture_rows, rank, repeat_rows

    entries, owner = [], {}
    for i, (entry, examples) in enumerate(loaded):
        at = f"{where}.datasets[{i}] ({entry.name})"
        tasks = sorted({ex.task for ex in examples})
        if len(tasks) != 1:
            raise ConfigError(f"{at}: holds tasks {tasks}; give each task its own entry (prompt template, rewards)")
        if not entry.labels:
            examples = [withhold_labels(ex) for ex in examples]
        examples = [dataclasses.replace(ex, meta={**ex.meta, ENTRY_META: entry.name}) for ex in examples]
        for ex in examples:
            if ex.id in owner:
                raise ConfigError(f"{at}: example {ex.id!r} is also in entry {owner[ex.id]!r} (listed twice?)")
            owner[ex.id] = entry.name
        entries.append((entry, tasks[0], examples))
    weights = [e.weight for e, _, _ in entries]
    rows = mixture_rows([len(x) for _, _, x in entries], weights)
    total = sum(weights)
    done = [LoadedEntry(e, task, x, e.weight / total, n) for (e, task, x), n in zip(entries, rows, strict=True)]
    drawn = [
        (rank(mixture.seed, f"{e.entry.name}:{k}:{ex.id}"), ex)
        for e in done
        for k, ex in enumerate(repeat_rows(e.examples, e.rows, mixture.seed, e.entry.name))
    ]
    return LoadedMixture(mixture.seed, done, [ex for _, ex in sorted(drawn, key=lambda p: p[0])])


def entry_of(example: Example) -> str | None:
    name = example.meta.get(ENTRY_META) if isinstance(example.meta, dict) else None
    return name if isinstance(name, str) else None


# --- per-entry prompts and rewards ---------------------------------------------------------------
def entry_prompts(base: Mapping[str, Any], loaded: LoadedMixture, where: str) -> dict[str, Any]:
    """One PromptConfig per entry, keyed by its name: the recipe's prompt keys (`base`, without the
    `prompt_` prefix), the entry's `prompt` mapping over them, and the entry's task unless it names one."""
    from vprl.train.prompts import PromptConfig

    names = {f.name for f in dataclasses.fields(PromptConfig)}
    out = {}
    for i, e in enumerate(loaded.entries):
        at = f"{where}.datasets[{i}].prompt"
        own = dict(e.entry.prompt or {})
        unknown = sorted(set(own) - names)
        if unknown:
            raise ConfigError(f"{at}: unknown key(s) {unknown}; valid keys are {sorted(names)}")
        settings = {**base, "task": e.task, **own}
        try:
            out[e.entry.name] = PromptConfig(**settings)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{at}: {exc}") from None
    return out


def reward_scopes(reward_names: Sequence[str], loaded: LoadedMixture, where: str) -> dict[str, frozenset[str]]:
    """The entries each reward scores. An entry names a subset of the recipe's rewards (all of them
    when it names none); a label-free entry may not be scored by a reward that reads labels."""
    scopes: dict[str, set[str]] = {name: set() for name in reward_names}
    for i, e in enumerate(loaded.entries):
        at = f"{where}.datasets[{i}].rewards"
        own = list(e.entry.rewards or reward_names)
        unknown = [r for r in own if r not in scopes]
        if unknown:
            raise ConfigError(f"{at}: {unknown} are not among the recipe's rewards {list(reward_names)}")
        reading = sorted(set(own) & LABEL_READING_REWARDS)
        if not e.entry.labels and reading:
            raise ConfigError(
                f"{at}: entry {e.entry.name!r} has labels: false, but {reading} read the labels; name the "
                "rewards that score it without them, e.g. rewards: [unit_tests]"
            )
        for r in own:
            scopes[r].add(e.entry.name)
    idle = [r for r, s in scopes.items() if not s]
    if idle:
        raise ConfigError(f"{where}: rewards {idle} score no entry; drop them or name them in an entry's rewards")
    return {r: frozenset(s) for r, s in scopes.items()}
