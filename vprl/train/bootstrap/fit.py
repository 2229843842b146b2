"""Bootstrap the tiny code policy: `python -m vprl.train.bootstrap --out DIR --seed S [--key value ...]`.

It generates a shapes world, pairs each training question's bare prompt (`# <query>` and the
signature, `PromptConfig(layout="bare")`) with its gold program or a plausible wrong one
(`vprl.data.shapes.mutations`), trains a tokenizer and a tiny Llama on the pairs with trl's
SFTTrainer (completion-only loss, full fine-tuning on CPU), and measures the result with the
sandboxed executor: greedy accuracy, mean accuracy of samples and pass@k, per question family.

The mixture is what makes the policy start imperfect the way real code LLMs do. Each training
family is either *strong* (gold most of the time, mistakes spread over many kinds) or *weak*
(gold a minority of the time, one dominant mistake the rest). Greedy decoding then writes the
dominant mistake for weak families and the gold for strong ones, while sampling still writes the
gold of weak families a fair share of the time: exactly the situation in which RL with a
correctness reward raises greedy accuracy. Which families are weak is drawn from the seed.

With `--tasks vqa itm grounding` the policy also learns to write image-text matching programs (the
world's Winoground- and SugarCREPE-style captions) and grounding programs (its RefCOCO-style
referring expressions, both splits), each family of them weak: the programs a mixture or a
label-free adaptation starts from. Families there are the Winoground tag or SugarCREPE category,
and the referral's kind (attribute, relation, position). The default (`vqa`) is the quickstart's
policy, unchanged: the new keys at their defaults leave the cache key as it was.

With `--repair_share S`, a share S of the pairs are repair examples (`repair_pairs.py`: a wrong
program, the feedback of its real run, the gold after it) and the measurement adds how often the
greedy policy's second program, written after that feedback, passes and is right.

`bootstrap.json` also says whether the policy copies its question's shape and colour into its
program (`noun_copy.py`): tiny policies learn it or do not, and which one follows the initial
weights and SFT's order (`--init_seed`, apart from the world's and the mixture's `--seed`) more
than the world. `--relabel_share R` permutes the shape and colour words of a share R of the question pairs
(`relabel.py`), and `--noun_weight W` weighs those words W times in SFT's loss (`noun_weight.py`).

Everything lands in DIR: model and tokenizer (safetensors), `bootstrap.json` (config, seed,
mixture, accuracies, timings) and the world it was trained on. Re-running with the same config
finds `bootstrap.json` and returns at once; `ensure_tiny_policy(cfg)` is that for other scripts.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
from vprl.data.shapes.tasks import load_shapes_tasks
from vprl.paths import CHECKOUT
from vprl.train.bootstrap.check import PolicyEval, evaluate_policy, format_table
from vprl.train.bootstrap.mixture import plan_mixture
from vprl.train.bootstrap.noun_copy import noun_copy
from vprl.train.bootstrap.noun_weight import noun_weighted_loss
from vprl.train.bootstrap.other_tasks import other_tasks, task_family
from vprl.train.bootstrap.pairs import SFTPair
from vprl.train.bootstrap.relabel import relabel_pairs
from vprl.train.bootstrap.repair_pairs import (
    REPAIR_FORMAT,
    REPAIR_PAIRS_FILE,
    add_repair_pairs,
    repair_figures,
    save_repair_pairs,
    within_context,
)
from vprl.train.policy.tiny import TinyModelConfig, build_model, parameter_count, train_tokenizer
from vprl.train.prompts import PromptConfig, PromptTemplate
from vprl.train.runs.folder import git_commit

VERSION = 1  # bump when the recipe changes so cached policies are rebuilt
TASKS = ("vqa", "itm", "grounding")
# Keys added after policies were cached: at these values they stay out of the cache key, so the
# quickstart's policy keeps its key (and its documented figures).
LATER_KEYS = {
    "tasks": ["vqa"],
    "world_winoground": 4,
    "world_sugarcrepe": 1,
    "world_refcoco": 4,
    "repair_share": 0.0,
    "repair_noun_share": 0.0,
    "relabel_share": 0.0,
    "init_seed": -1,
    "noun_weight": 1.0,
}


# The names the cache key has always used for settings since renamed (docs/configs.md): a policy
# built before the renaming is still found.
KEY_NAMES = {
    "tool_stack": "tools",
    "num_generations": "eval_samples",
    "temperature": "eval_temperature",
    "top_p": "eval_top_p",
    "max_completion_length": "eval_max_new_tokens",
}


@dataclass(frozen=True)
class BootstrapConfig(TinyModelConfig):
    """The tiny policy's recipe: the model's sizes (`TinyModelConfig`'s fields), then these."""

    out: str = field(default="runs/tiny_policy", metadata={"help": "folder of the policy (cached by this recipe)"})
    seed: int = field(default=0, metadata={"help": "seed of the world, the mixture and (unless init_seed) training"})
    init_seed: int = field(
        default=-1,
        metadata={
            "help": "seed of the initial weights and of SFT's order and dropout (-1: `seed`'s); world and mixture keep `seed`"
        },
    )
    # the world trained on (its validation questions are the evaluation's)
    world_train: int = field(default=1100, metadata={"help": "training images of the shapes world"})
    world_val: int = field(default=150, metadata={"help": "validation images of the shapes world"})
    world_winoground: int = field(default=4, metadata={"help": "Winoground-style examples of the world"})
    world_sugarcrepe: int = field(default=1, metadata={"help": "SugarCREPE-style entries per category"})
    world_refcoco: int = field(default=4, metadata={"help": "RefCOCO-style images of the world"})
    tasks: list[str] = field(
        default_factory=lambda: ["vqa"],
        metadata={"help": "tasks whose programs the policy learns: vqa, and itm / grounding (weak, for mixtures)"},
    )
    # the mixture
    weak_share: float = field(
        default=0.6, metadata={"help": "share of training families whose greedy program is wrong"}
    )
    gold_strong: float = field(default=0.85, metadata={"help": "P(gold program) in a strong family"})
    gold_weak: float = field(default=0.3, metadata={"help": "P(gold program) in a weak family"})
    dominant: float = field(
        default=0.75, metadata={"help": "share of a weak family's mistakes that are its dominant one"}
    )
    copies: int = field(default=2, metadata={"help": "target programs drawn per training question"})
    relabel_share: float = field(
        default=0.0,
        metadata={"help": "share of the question pairs with shape and colour words permuted in both (relabel.py)"},
    )
    repair_share: float = field(
        default=0.0, metadata={"help": "share of the pairs that are repair examples (repair_pairs.py)"}
    )
    repair_noun_share: float = field(
        default=0.0,
        metadata={"help": "share of the repair examples whose wrong program names another shape (wrong_noun)"},
    )
    # supervised training
    epochs: float = field(default=3.0, metadata={"help": "passes over the mixture"})
    max_steps: int = field(default=-1, metadata={"help": "stop after this many steps (-1: epochs decide)"})
    batch_size: int = field(default=16, metadata={"help": "sequences per step"})
    learning_rate: float = field(default=5e-3, metadata={"help": "peak learning rate"})
    noun_weight: float = field(
        default=1.0, metadata={"help": "loss weight of the target programs' shape and colour words (noun_weight.py)"}
    )
    warmup_steps: float = field(default=0.05, metadata={"help": "warm-up: steps, or a ratio of all steps below 1"})
    # evaluation: greedy and sampled programs on `eval_val` questions of the training families on new
    # images and `eval_heldout` of the held-out families
    tool_stack: str = field(
        default="shapes", metadata={"help": "tools of the evaluation: oracle | shapes | a tool-stack YAML"}
    )
    eval_val: int = field(default=80, metadata={"help": "training-family questions on new images"})
    eval_heldout: int = field(default=50, metadata={"help": "held-out-family questions"})
    num_generations: int = field(default=8, metadata={"help": "programs sampled per question"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass"})
    # the longest shapes-world program is about 90 tokens
    max_completion_length: int = field(default=160, metadata={"help": "program length limit in tokens"})
    # how it runs (not in the cache key)
    executor_slots: int = field(default=2, metadata={"help": "programs run in parallel (not in the cache key)"})
    threads: int = field(default=2, metadata={"help": "torch CPU threads (not in the cache key)"})
    executor_sandbox: str = field(
        default="auto",
        metadata={
            "help": "auto (full where namespaces work, else restricted) | full | restricted | none (debugging only)"
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # the sizes
        for name in ("weak_share", "gold_strong", "gold_weak", "dominant", "relabel_share"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"BootstrapConfig.{name} must be in [0, 1], got {value}")
        if not 0 <= self.repair_share < 1:
            raise ValueError(f"BootstrapConfig.repair_share must be in [0, 1), got {self.repair_share}")
        if not 0 <= self.repair_noun_share <= 1:
            raise ValueError(f"BootstrapConfig.repair_noun_share must be in [0, 1], got {self.repair_noun_share}")
        for name in (
            "world_train",
            "world_val",
            "copies",
            "batch_size",
            "threads",
            "num_generations",
            "executor_slots",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"BootstrapConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.noun_weight <= 0:
            raise ValueError(f"BootstrapConfig.noun_weight must be > 0, got {self.noun_weight}")
        if self.init_seed < -1:
            raise ValueError(f"BootstrapConfig.init_seed must be -1 (the seed's) or >= 0, got {self.init_seed}")
        for name in ("world_winoground", "world_sugarcrepe", "world_refcoco"):
            if getattr(self, name) < 0:
                raise ValueError(f"BootstrapConfig.{name} must be >= 0, got {getattr(self, name)}")
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown or "vqa" not in self.tasks:
            raise ValueError(f"BootstrapConfig.tasks: {list(self.tasks)} must hold vqa and only {', '.join(TASKS)}")

    @property
    def training_seed(self) -> int:
        """The initial weights' and SFT's seed: `init_seed`, or `seed` where it is -1 (every policy
        built before `init_seed` existed), so a seed's world can be trained from other weights."""
        return self.seed if self.init_seed == -1 else self.init_seed

    def model_config(self) -> TinyModelConfig:
        return TinyModelConfig(**{f.name: getattr(self, f.name) for f in fields(TinyModelConfig)})

    def key(self) -> str:
        """Hash of everything that changes the policy (not where it is written, nor how many
        sandbox slots evaluate it, nor in which sandbox)."""
        data = {
            KEY_NAMES.get(k, k): v
            for k, v in asdict(self).items()
            if k not in ("out", "executor_slots", "threads", "executor_sandbox")
        }
        data = {k: v for k, v in data.items() if not (k in LATER_KEYS and v == LATER_KEYS[k])}
        if self.repair_share > 0:  # the repair examples' text is part of the policy
            data["repair_format"] = REPAIR_FORMAT
        return hashlib.sha256(json.dumps({"v": VERSION, **data}, sort_keys=True).encode()).hexdigest()[:16]


def ensure_world(cfg: BootstrapConfig) -> Path:
    root = Path(cfg.out) / "world"
    build = BuildConfig(
        out=str(root),
        train=cfg.world_train,
        val=cfg.world_val,
        seed=cfg.seed,
        winoground=cfg.world_winoground,
        sugarcrepe=cfg.world_sugarcrepe,
        refcoco=cfg.world_refcoco,
    )
    manifest = root / "manifest.json"
    wanted = {k: v for k, v in build.to_json().items() if k not in ("out", "workers")}
    if not (manifest.is_file() and json.loads(manifest.read_text()).get("config") == wanted):
        build_dataset(build)
    return root


def sft(model, tokenizer, pairs: list[SFTPair], cfg: BootstrapConfig, work: Path) -> dict[str, Any]:
    """Full fine-tuning with trl's SFTTrainer; returns the trainer's final metrics."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from vprl.train.recipe.trainer_args import checkpointing

    data = Dataset.from_list([{"prompt": p.prompt, "completion": p.completion} for p in pairs])
    args = SFTConfig(
        output_dir=str(work),
        completion_only_loss=True,
        **checkpointing(False),  # trl turns it on by default; a tiny model needs no memory saving
        max_length=cfg.context,
        per_device_train_batch_size=cfg.batch_size,
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=cfg.warmup_steps,
        weight_decay=0.0,
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=cfg.training_seed,
        data_seed=cfg.training_seed,
        dataloader_num_workers=0,
        disable_tqdm=False,
    )
    # trl's own loss unless the nouns weigh more: the hook adds a forward for trl's metrics
    weighted = (
        {"compute_loss_func": noun_weighted_loss(tokenizer, cfg.noun_weight, data["completion"])}
        if cfg.noun_weight != 1
        else {}
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer, **weighted)
    first = trainer.train_dataset[0]["input_ids"]
    if first.count(tokenizer.bos_token_id) != 1 or first[0] != tokenizer.bos_token_id:
        raise RuntimeError(f"SFT sequences must start with exactly one BOS; got ids {first[:8]}...")
    result = trainer.train()
    return {"steps": result.global_step, "train_loss": round(float(result.training_loss), 4)}


def run(cfg: BootstrapConfig) -> dict[str, Any]:
    """Build, train, evaluate and save the policy in `cfg.out`; returns what bootstrap.json holds."""
    import torch

    # `threads` is the bootstrap's own: the quickstart and the benchmarks train next in this process.
    before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _build(cfg)
    finally:
        torch.set_num_threads(before)


def _build(cfg: BootstrapConfig) -> dict[str, Any]:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    cpu0 = sum(os.times()[:4])
    root = ensure_world(cfg)
    tasks = load_shapes_tasks(root, ["train", "val", "heldout"])
    golds = load_gold_programs(root)
    gold = golds["vqa"]
    others = other_tasks(root, cfg.tasks)
    timings["world_s"] = time.perf_counter() - t0

    t = time.perf_counter()
    rng = np.random.default_rng(cfg.seed)
    pairs, plan = plan_mixture(tasks["train"], gold, cfg, rng)
    if others:  # a generator of its own, so the VQA part is drawn as without them
        other_gold = {q: p for task in ("itm", "grounding") for q, p in golds.get(task, {}).items()}
        more, more_plan = plan_mixture(
            others,
            other_gold,
            cfg,
            np.random.default_rng([cfg.seed, 1]),
            family_of=lambda ex: task_family(ex, other_gold[ex.query]),
            all_weak=True,
        )
        both = pairs + more
        pairs = [both[int(i)] for i in np.random.default_rng([cfg.seed, 2]).permutation(len(both))]
        plan.update(more_plan)
    relabelled = 0
    if cfg.relabel_share > 0:  # a generator of its own: the rest of the mixture is drawn as without it
        pairs, relabelled = relabel_pairs(pairs, cfg.relabel_share, np.random.default_rng([cfg.seed, 3]))
    repair = None
    if cfg.repair_share > 0:  # drawn with a generator of their own too
        pairs, repair = add_repair_pairs(pairs, tasks["train"], gold, cfg, root, out)
    corpus = [p.prompt + p.completion for p in pairs]
    corpus += [PromptTemplate.from_config(PromptConfig(layout="bare")).build(e.query) for e in tasks["heldout"]]
    tokenizer = train_tokenizer(corpus, cfg.vocab_size, cfg.context)
    if repair:
        pairs, repair["too_long"] = within_context(pairs, tokenizer, cfg.context)
        # kept beside the policy: a repair run can replay them (`repair_replay_weight`)
        save_repair_pairs(pairs, out / REPAIR_PAIRS_FILE)
    model = build_model(tokenizer, cfg.model_config(), seed=cfg.training_seed)
    timings["data_s"] = time.perf_counter() - t
    n_params = parameter_count(model)
    print(f"tiny policy: {n_params / 1e6:.2f}M parameters, vocabulary {len(tokenizer)}, {len(pairs)} SFT pairs")

    t = time.perf_counter()
    training = sft(model, tokenizer, pairs, cfg, out / "sft")
    timings["sft_s"] = time.perf_counter() - t
    # SFT turned the KV cache off for training; whoever loads the policy next decodes with it, and
    # without it generation is many times slower (trl's GRPO generates with the saved setting).
    model.config.use_cache = True
    model.generation_config.use_cache = True
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))

    t = time.perf_counter()
    evals = {
        name: evaluate_policy(model, tokenizer, tasks[name][:limit], gold, root, cfg)
        for name, limit in (("val", cfg.eval_val), ("heldout", cfg.eval_heldout))
        if limit > 0
    }
    if repair:
        evals = {
            name: replace(e, repair=repair_figures(model, tokenizer, tasks[name][: e.overall.n], root, out, cfg))
            for name, e in evals.items()
        }
    copies = {name: noun_copy(model, tokenizer, tasks[name][: e.overall.n], gold) for name, e in evals.items()}
    timings["eval_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t0
    cpu = os.times()
    timings["cpu_s"] = cpu.user + cpu.system + cpu.children_user + cpu.children_system - cpu0
    summary = {
        "key": cfg.key(),
        "version": VERSION,
        "config": asdict(cfg),
        # the code that built it: a screen's bootstraps are compared across commits
        "git": git_commit(CHECKOUT) if CHECKOUT else {"commit": None, "dirty": None},
        "seed": cfg.seed,
        "parameters": n_params,
        "vocabulary": len(tokenizer),
        "sft_pairs": len(pairs),
        "mixture": plan,
        **({"relabelled_pairs": relabelled} if cfg.relabel_share > 0 else {}),
        **({"repair_examples": repair} if repair else {}),
        "training": training,
        "evaluation": {name: e.to_json() for name, e in evals.items()},
        "noun_copy": copies,
        "timings": {k: round(v, 1) for k, v in timings.items()},
    }
    (out / "bootstrap.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    for name, e in evals.items():
        print(f"\n{name}:\n{format_table(e)}")
        for kind, c in copies[name].items():
            if c["questions"]:
                print(
                    f"{kind} copy: P(the question's {kind} | a {kind}) {c['p_right']:.3f}, the likeliest "
                    f"{100 * c['argmax_right']:.1f}% of {c['questions']} questions"
                )
    print(
        f"\nbootstrap: {timings['total_s']:.0f}s in all ({timings['cpu_s']:.0f} CPU-s); "
        f"policy and bootstrap.json in {out}"
    )
    return summary


def cached(cfg: BootstrapConfig) -> dict[str, Any] | None:
    """The saved summary when `cfg.out` holds a policy built from this very config."""
    path = Path(cfg.out) / "bootstrap.json"
    if not (path.is_file() and (Path(cfg.out) / "model.safetensors").is_file()):
        return None
    summary = json.loads(path.read_text(encoding="utf-8"))
    return summary if summary.get("key") == cfg.key() else None


def ensure_tiny_policy(cfg: BootstrapConfig | None = None) -> Path:
    """The directory of a bootstrapped policy for `cfg`, building it first when it is not cached."""
    cfg = cfg or BootstrapConfig()
    if cached(cfg) is None:
        run(cfg)
    return Path(cfg.out)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from vprl.train.recipe.parsing import parse_config

    (cfg,) = parse_config(
        (BootstrapConfig,),
        argv if argv is not None else sys.argv[1:],
        prog="python -m vprl.train.bootstrap",
        description=__doc__.split("\n\n")[0],
    )
    summary = cached(cfg)
    if summary is not None:
        print(f"bootstrap: {cfg.out} already holds this policy (key {summary['key']}); nothing to do")
        for name, e in summary["evaluation"].items():
            print(f"\n{name}:\n{format_table(PolicyEval.from_json(e))}")
        return summary
    return run(cfg)
