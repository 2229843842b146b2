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

import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
from vprl.data.shapes.tasks import load_shapes_tasks
from vprl.paths import CHECKOUT
from vprl.train.bootstrap.check import PolicyEval, evaluate_policy, format_table
from vprl.train.bootstrap.config import VERSION, BootstrapConfig
from vprl.train.bootstrap.mixture import plan_mixture
from vprl.train.bootstrap.noun_copy import noun_copy
from vprl.train.bootstrap.noun_weight import noun_weighted_loss
from vprl.train.bootstrap.other_tasks import other_tasks, task_family
from vprl.train.bootstrap.pairs import SFTPair
from vprl.train.bootstrap.relabel import relabel_pairs
from vprl.train.bootstrap.repair_pairs import (
    REPAIR_PAIRS_FILE,
    add_repair_pairs,
    repair_figures,
    save_repair_pairs,
    within_context,
)
from vprl.train.policy.tiny import build_model, parameter_count, train_tokenizer
from vprl.train.prompts import PromptConfig, PromptTemplate
from vprl.train.runs.folder import git_commit


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
