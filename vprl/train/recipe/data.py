"""Training examples and their prompts for the RL entry point.

Examples come from the shapes world (`dataset: shapes`, named tasks), from a dataset loader
(`vprl.data.loaders.load_dataset`), or from several of them (`dataset_mixture`, `vprl.train.recipe.mixture`).
Each task (each entry of a mixture) gets one prompt template (the signature depends on the task);
the prompt text handed to trl is the framed prompt, in the form whose tokenization by the tokenizer
alone (what trl does) equals `encode_prompt`'s ids: exactly one BOS. `dataset_labels: false` (an
entry's `labels: false`) withholds the answers right after loading (`mixture.withhold_labels`).
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vprl.data.loaders.sampling import EpochTooLong
from vprl.data.records import Example
from vprl.train.prompts import PromptConfig, PromptTemplate, encode_prompt, frame_prompt
from vprl.train.recipe.mixture import KEY as MIXTURE_KEY
from vprl.train.recipe.mixture import LoadedMixture, MixtureEntry, as_mixture, assemble, entry_of, withhold_labels
from vprl.train.recipe.parsing import ConfigError
from vprl.train.recipe.sections import DataArgs, PromptArgs

SHAPES = "shapes"
# The papers' training/evaluation samples (vprl.data.loaders.sampling), by recipe name.
SAMPLES = {
    "gqa_train": "gqa_train_sample",
    "gqa_eval": "gqa_eval_sample",
    "okvqa": "okvqa_sample",
    "vqav2": "vqav2_sample",
    "refcoco_train": "refcoco_train_sample",
    "sugarcrepe_train": "sugarcrepe_train_sample",
}


def dataset_names() -> list[str]:
    from vprl.data.loaders import DATASETS

    return [SHAPES, *DATASETS]


def check_data(args: DataArgs) -> None:
    """Config-time checks: a known dataset name and an existing root."""
    if args.dataset not in dataset_names():
        raise ConfigError(f"dataset: unknown dataset {args.dataset!r}; valid: {', '.join(dataset_names())}")
    if not args.dataset_root:
        raise ConfigError(f"dataset_root: required (the folder holding the {args.dataset!r} files)")
    if not Path(args.dataset_root).is_dir():
        raise ConfigError(f"dataset_root: {args.dataset_root} does not exist (dataset {args.dataset!r})")
    if args.dataset_sample is not None and args.dataset_sample not in SAMPLES:
        raise ConfigError(f"dataset_sample: {args.dataset_sample!r} is not one of {', '.join(SAMPLES)}")
    if args.dataset_limit is not None and args.dataset_limit < 1:
        raise ConfigError(f"dataset_limit must be a positive integer or null, got {args.dataset_limit}")


def load_examples(args: DataArgs) -> list[Example]:
    """The recipe's examples: one dataset's, or one epoch of a mixture's rows (`load_mixture`)."""
    if args.dataset_mixture is not None:
        return load_mixture(args).drawn
    examples = _one_dataset(args)
    return examples if args.dataset_labels else [withhold_labels(ex) for ex in examples]


def _one_dataset(args: DataArgs) -> list[Example]:
    check_data(args)
    examples = _sampled(args) if args.dataset_sample is not None else _load(args)
    if args.dataset_limit is not None:
        examples = examples[: args.dataset_limit]
    if not examples:
        raise ConfigError(f"dataset {args.dataset!r} at {args.dataset_root}: no examples")
    dupes = [i for i, n in Counter(ex.id for ex in examples).items() if n > 1]
    if dupes:
        raise ConfigError(f"dataset {args.dataset!r}: duplicate example ids {dupes[:5]} (tasks listed twice?)")
    return examples


def load_mixture(args: DataArgs) -> LoadedMixture:
    """Every entry of `args.dataset_mixture` loaded as a one-dataset recipe would load it, its
    labels withheld where it says `labels: false`, and drawn by weight (`mixture.assemble`)."""
    mixture = as_mixture(args.dataset_mixture)
    loaded = []
    for i, entry in enumerate(mixture.datasets):
        try:
            loaded.append((entry, _one_dataset(entry_args(entry, args))))
        except ConfigError as exc:
            raise ConfigError(f"{MIXTURE_KEY}.datasets[{i}] ({entry.name}): {exc}") from None
    try:
        return assemble(mixture, loaded, MIXTURE_KEY)
    except EpochTooLong as exc:
        entry = mixture.datasets[exc.index]
        raise ConfigError(
            f"{MIXTURE_KEY}.datasets[{exc.index}] ({entry.name}).weight: {entry.weight:g} is too small: {exc}"
        ) from None


def entry_args(entry: MixtureEntry, base: DataArgs) -> DataArgs:
    """A mixture entry as one-dataset keys; its root relative to the recipe's `dataset_root`."""
    root = entry.root
    if root is None:
        root = base.dataset_root
    elif base.dataset_root and not Path(root).is_absolute():
        root = str(Path(base.dataset_root) / root)
    return DataArgs(
        dataset=entry.dataset,
        dataset_root=root,
        dataset_split=entry.split,
        dataset_tasks=list(entry.tasks or ["train"]),
        dataset_sample=entry.sample,
        dataset_sample_seed=base.dataset_sample_seed if entry.sample_seed is None else entry.sample_seed,
        dataset_sample_cache=base.dataset_sample_cache,
        dataset_limit=entry.limit,
        dataset_options=dict(entry.options or {}),
    )


def _load(args: DataArgs) -> list[Example]:
    try:
        if args.dataset == SHAPES:
            from vprl.data.shapes.tasks import load_shapes_tasks

            if args.dataset_options:
                raise ConfigError("dataset_options: the shapes world takes none (choose tasks with dataset_tasks)")
            tasks = load_shapes_tasks(args.dataset_root, list(args.dataset_tasks))
            return [ex for name in args.dataset_tasks for ex in tasks[name]]
        from vprl.data.loaders import load_dataset

        return load_dataset(args.dataset, args.dataset_root, args.dataset_split, **(args.dataset_options or {}))
    except (FileNotFoundError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"dataset {args.dataset!r} at {args.dataset_root}: {exc}") from exc


def _draw(args: DataArgs):
    from vprl.data.loaders import sampling

    try:
        return getattr(sampling, SAMPLES[args.dataset_sample])(_load(args), seed=args.dataset_sample_seed)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"dataset_sample {args.dataset_sample!r}: {exc}") from None


def sample_cache_dir(setting: str | None) -> Path | None:
    if setting is None:
        return None
    if setting != "auto":
        return Path(setting).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vprl" / "samples"


def _sampled(args: DataArgs) -> list[Example]:
    """The recipe's sample. From a GQA file it is drawn once and kept (`sampling.cached_sample`):
    every training process loads the recipe, and parsing balanced-train (943k questions) for 1,022
    of them would cost each process the time and the gigabytes of memory of the whole file."""
    cache = sample_cache_dir(args.dataset_sample_cache)
    if cache is None or args.dataset != "gqa":
        return _draw(args).examples
    from vprl.data.loaders import gqa, sampling

    split = args.dataset_split or "val"  # load_dataset's default for gqa
    options = dict(args.dataset_options or {})
    try:
        source = gqa.gqa_questions_path(args.dataset_root, split, **options)
    except FileNotFoundError as exc:
        raise ConfigError(f"dataset {args.dataset!r} at {args.dataset_root}: {exc}") from None
    recipe = {
        "dataset": args.dataset,
        "root": str(Path(args.dataset_root).resolve()),
        "root_as_given": args.dataset_root,  # the examples' image paths are built from it
        "split": split,
        "options": options,
        "sample": args.dataset_sample,
        "seed": args.dataset_sample_seed,
    }
    code = [gqa.__file__, sampling.__file__]
    try:
        sample = sampling.cached_sample(lambda: _draw(args), cache, recipe=recipe, sources=[source], code=code)
    except OSError as exc:
        raise ConfigError(f"dataset_sample_cache: {cache}: {exc}") from None
    if options.get("check_images"):
        from vprl.data.loaders import check_image_files

        try:  # a cached sample skips the loader, and its check with it
            check_image_files(sample.examples)
        except FileNotFoundError as exc:
            raise ConfigError(f"dataset {args.dataset!r} at {args.dataset_root}: {exc}") from None
    return sample.examples


def prompt_configs(args: PromptArgs, examples: list[Example]) -> dict[str, PromptConfig]:
    """One PromptConfig per task present (`prompt_task` forces one task for all). Every other
    `prompt_<name>` key of the recipe is PromptConfig's `<name>`."""
    base = {f.name.removeprefix("prompt_"): getattr(args, f.name) for f in dataclasses.fields(args)}
    forced = base.pop("task")
    if args.prompt_ice_file is not None and not Path(args.prompt_ice_file).is_file():
        raise ConfigError(f"prompt_ice_file: {args.prompt_ice_file} does not exist")
    tasks = [forced] if forced else sorted({ex.task for ex in examples})
    try:
        return {task: PromptConfig(task=task, **base) for task in tasks}
    except ValueError as exc:
        raise ConfigError(f"prompt: {exc}") from None


@dataclass(frozen=True)
class PromptedExample:
    example: Example
    prompt: str  # unframed (what vprl.train.sampling.generator / the ReST loop take)
    prompt_hash: str


def build_prompts(examples: list[Example], configs: dict[str, PromptConfig]) -> list[PromptedExample]:
    """Each example with its prompt: the template of its mixture entry when `configs` holds one by
    that name (`mixture.entry_prompts`), else the template of its task."""
    templates = {key: PromptTemplate.from_config(cfg) for key, cfg in configs.items()}
    forced = next(iter(templates.values())) if len(templates) == 1 else None
    out = []
    for ex in examples:
        template = forced or templates.get(entry_of(ex) or "") or templates[ex.task]
        out.append(PromptedExample(ex, template.build(ex.query), template.hash))
    return out


def trl_prompt_text(prompt: str, tokenizer: Any, style: str = "auto") -> str:
    """The framed prompt as trl should receive it: trl tokenizes with the tokenizer's special tokens,
    so a chat-framed text that already starts with BOS loses it here and the tokenizer adds it back.
    Fails when no form gives `encode_prompt`'s ids (a tokenizer whose post-processor adds no BOS)."""
    framed = frame_prompt(prompt, tokenizer, style)
    want = encode_prompt(framed, tokenizer)
    candidates = [framed]
    bos = getattr(tokenizer, "bos_token", None)
    if bos and framed.startswith(bos):
        candidates.insert(0, framed[len(bos) :])
    for text in candidates:
        if list(tokenizer(text)["input_ids"]) == want:
            return text
    raise ConfigError(
        "the tokenizer does not add its BOS the way the prompt framing expects, so trl's tokenization would "
        f"differ from generation's (first ids {want[:4]} vs {list(tokenizer(framed)['input_ids'])[:4]})"
    )


def trl_dataset(prompted: list[PromptedExample], tokenizer: Any, style: str = "auto"):
    """`datasets.Dataset` with `prompt` (framed text) and `example_id`, the columns the reward adapter reads."""
    from datasets import Dataset

    return Dataset.from_list(
        [{"prompt": trl_prompt_text(p.prompt, tokenizer, style), "example_id": p.example.id} for p in prompted]
    )


def split_record(args: DataArgs, examples: list[Example], mixture: LoadedMixture | None = None) -> dict[str, Any]:
    """The manifest's dataset entry: what was trained on, with an id of the exact example set; for
    a mixture, each entry's keys, share, rows per epoch and split id."""
    from vprl.data.loaders.sampling import split_id

    root = str(Path(args.dataset_root).resolve()) if args.dataset_root else None
    if mixture is not None:
        unique = mixture.examples
        return {
            "dataset": "mixture",
            "root": root,
            "examples": len(unique),
            "rows": len(mixture.drawn),
            "split_id": split_id("mixture", [ex.id for ex in unique]),
            "task_counts": dict(Counter(ex.task for ex in unique)),
            "labels": all(e.entry.labels for e in mixture.entries),
            "mixture": {"seed": mixture.seed, "datasets": [e.record() for e in mixture.entries]},
        }
    name = args.dataset if args.dataset != SHAPES else f"shapes:{'+'.join(args.dataset_tasks)}"
    return {
        "dataset": args.dataset,
        "root": root,
        "split": args.dataset_split,
        "tasks": list(args.dataset_tasks) if args.dataset == SHAPES else None,
        "sample": args.dataset_sample,
        "sample_seed": args.dataset_sample_seed,
        "limit": args.dataset_limit,
        "labels": args.dataset_labels,
        "examples": len(examples),
        "split_id": split_id(name, [ex.id for ex in examples]),
        "task_counts": dict(Counter(ex.task for ex in examples)),
    }
