"""Stanić et al.'s ACE procedure (`python -m vprl.train.ace stanic --config CFG.yaml ...`).

The policy zero-shot on a small labelled set (`n` random examples or a list of `ids`), optionally
retried after an execution failure (self-debugging re-prompt with the error, or resampling;
label-free, as in the paper), scored (correctness / IoU), sorted by score, the top k with
score >= min_score kept. The output format is `vprl.train.ace.output`, the command `vprl/train/ace/__main__.py`.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vprl.data.records import Example
from vprl.executor.program import ENTRY
from vprl.train.ace.records import Ace, AceError, AceReport, distinct
from vprl.train.prompts import PreviousAttempt, PromptTemplate, completion_to_program
from vprl.train.rollouts.log import RolloutLog, RolloutRow
from vprl.train.rollouts.scorer import ProgramScorer
from vprl.train.sampling.generator import Generator, SamplingSettings, policy_sampling

RETRY_MODES = ("self_debug", "resample")
STANIC_SAMPLING = policy_sampling(temperature=0.4)  # code-bison at T 0.4 ([S] Table 3)


def pick_examples(examples: Sequence[Example], ids: Sequence[str] = (), n: int = 100, seed: int = 0) -> list[Example]:
    """The labelled set: the listed ids (in that order), or `n` examples drawn at random with `seed`."""
    if ids:
        by_id = {ex.id: ex for ex in examples}
        unknown = [i for i in ids if i not in by_id]
        if unknown:
            raise AceError(f"ids: {len(unknown)} not in the dataset, e.g. {unknown[:3]}")
        return [by_id[i] for i in ids]
    if n < 1:
        raise AceError(f"n must be a positive integer, got {n}")
    return random.Random(seed).sample(list(examples), min(n, len(examples)))


def stanic_aces(
    examples: Sequence[Example],
    generator: Generator,
    scorer: ProgramScorer,
    template: PromptTemplate | Callable[[Example], PromptTemplate],
    k: int,
    sampling: SamplingSettings = STANIC_SAMPLING,
    trials: int = 1,
    retry: str = "self_debug",
    min_score: float = 0.5,
    policy: str = "",
    tool_stack: Any = None,
    log: RolloutLog | None = None,
) -> AceReport:
    """Zero-shot programs for `examples`, retried up to `trials` times in all while they fail to
    execute (never on a wrong answer: the retry is label-free), scored, sorted, top k kept.

    `template` is one prompt template or a function from an example to its template (mixed tasks).
    Every attempt is appended to `log` (rollout rows, `step` = trial) when given.
    """
    if k < 1 or trials < 1:
        raise AceError(f"k and trials must be positive integers, got k={k}, trials={trials}")
    if retry not in RETRY_MODES:
        raise AceError(f"retry: {retry!r} is not one of {RETRY_MODES}")
    templates = template if callable(template) and not isinstance(template, PromptTemplate) else (lambda _: template)
    final: dict[int, tuple[RolloutRow, str]] = {}
    pending = list(range(len(examples)))
    for trial in range(trials):
        batch = [examples[i] for i in pending]
        previous = [
            PreviousAttempt(final[i][1], final[i][0].error or final[i][0].status)
            if trial and retry == "self_debug"
            else None
            for i in pending
        ]
        prompts = [templates(ex).build(ex.query, previous=prev) for ex, prev in zip(batch, previous, strict=True)]
        seeded = dataclasses.replace(sampling, n=1, seed=None if sampling.seed is None else sampling.seed + trial)
        completions = generator.generate(prompts, seeded)
        programs = [completion_to_program(p, c[0]) for p, c in zip(prompts, completions, strict=True)]
        scored = scorer.score(batch, programs, progress=True)
        hashes = [templates(ex).hash for ex in batch]
        rows = [
            dataclasses.replace(row, prompt_hash=h)
            for row, h in zip(scored.rows(trial, batch, programs, "", policy, keep_trace=False), hashes, strict=True)
        ]
        if log is not None:
            log.append(rows)
        for i, row, program in zip(pending, rows, programs, strict=True):
            final[i] = (row, program)
        pending = [i for i, row in zip(pending, rows, strict=True) if row.status not in ("ok", "infra_error")]
        if not pending:
            break
    good = [
        (i, row, program)
        for i, (row, program) in final.items()
        if row.status == "ok" and row.total is not None and row.total >= min_score and f"def {ENTRY}" in program
    ]
    good.sort(key=lambda item: (-item[1].total, item[0]))  # ties keep the labelled set's order
    source = f"stanic:{policy}" if policy else "stanic"
    ranked = distinct([Ace.from_row(row, program, source, policy, tool_stack) for _, row, program in good])
    counts = {"examples": len(examples), "good": len(good), "distinct": len(ranked)}
    counts["solved_by_retry"] = sum(1 for _, row, _ in good if row.step > 0)
    families = sorted({ex.group for ex in examples if ex.group})
    notes = [] if good else [f"none of the {len(examples)} programs scored >= {min_score}"]
    return AceReport(ranked[:k], k, "stanic", source, counts, families, notes)


@dataclass
class StanicArgs:
    """Settings of `python -m vprl.train.ace stanic` beyond the policy/data/prompt/executor sections of vprl/train/rl.py."""

    k: int = field(default=16, metadata={"help": "how many ACEs to keep"})
    out: str = field(
        default="aces.jsonl", metadata={"help": "the ACE file to write (.jsonl; a .md preview beside it)"}
    )
    n: int = field(default=100, metadata={"help": "labelled questions drawn from the dataset"})
    ids: list[str] = field(default_factory=list, metadata={"help": "these example ids instead of a random draw"})
    seed: int = field(default=0, metadata={"help": "seed of the draw and of sampling"})
    trials: int = field(default=1, metadata={"help": "programs sampled per question"})
    retry: str = field(
        default="self_debug", metadata={"help": f"after an execution failure: {' | '.join(RETRY_MODES)}"}
    )
    min_score: float = field(default=0.5, metadata={"help": "a program's reward must reach this to become an ACE"})
    temperature: float = field(default=0.4, metadata={"help": "sampling temperature (Stanić et al.: 0.4)"})
    top_p: float = field(default=0.9, metadata={"help": "nucleus sampling mass"})
    max_completion_length: int = field(default=320, metadata={"help": "program length limit in tokens"})
    batch_size: int = field(default=8, metadata={"help": "prompts per generation batch"})
    rewards: Any = field(
        default_factory=lambda: ["correctness"],
        metadata={"help": "the score: reward names or {name, weight, settings}"},
    )


def stanic_from_config(argv: list[str], prog: str | None = None) -> tuple[AceReport, str]:
    from vprl.executor.backends import open_backend
    from vprl.executor.host import ToolHost
    from vprl.executor.runner import SyncRunner
    from vprl.rewards.build import build_rewards
    from vprl.rewards.compose import RewardConfig
    from vprl.train.policy.loading import check_policy, policy_name
    from vprl.train.recipe.checks import tool_stack
    from vprl.train.recipe.data import load_examples, prompt_configs
    from vprl.train.recipe.parsing import parse_config
    from vprl.train.recipe.rl_config import DataArgs, ExecutorArgs, PolicyArgs, PromptArgs

    policy_args, data, prompt, executor, args = parse_config(
        (PolicyArgs, DataArgs, PromptArgs, ExecutorArgs, StanicArgs),
        argv,
        prog=prog,
        description="Stanić et al.'s ACEs: the policy zero-shot on labelled questions, the best programs kept. "
        "Takes the policy, data, prompt and executor keys of vprl/train/rl.py's recipe and the keys below.",
    )
    check_policy(policy_args)
    examples = pick_examples(load_examples(data), args.ids, args.n, args.seed)
    templates = {task: PromptTemplate.from_config(c) for task, c in prompt_configs(prompt, examples).items()}
    stack, overrides = tool_stack(executor, data)
    runner_cfg = executor.runner_config()
    out = Path(args.out)
    log = RolloutLog(out.with_suffix(".attempts.jsonl"))
    log.path.unlink(missing_ok=True)
    sampling = policy_sampling(
        temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_completion_length, seed=args.seed
    )
    tool_record = {"file": executor.tool_stack, "config": {k: v for k, v in stack.items() if k != "_source"}}
    backend = open_backend(stack, service=executor.tool_service, **overrides)
    # The executor starts before the policy is loaded (its sandboxes fork from a process that holds no
    # model, token or CUDA state).
    with SyncRunner(ToolHost(backend), runner_cfg) as runner:
        generator = stanic_generator(policy_args, args.batch_size)
        scorer = ProgramScorer(runner, build_rewards(RewardConfig.from_json({"rewards": args.rewards})))
        report = stanic_aces(
            examples,
            generator,
            scorer,
            lambda ex: templates[ex.task],
            args.k,
            sampling,
            args.trials,
            args.retry,
            args.min_score,
            policy_name(policy_args),
            tool_record,
            log,
        )
    return report, args.out


def stanic_generator(policy: Any, batch_size: int) -> Generator:
    """The policy zero-shot (its `adapter_path` when given), loaded and placed like training places it."""
    from vprl.train.policy.loading import load_for_sampling
    from vprl.train.sampling.hf import HFGenerator

    model, tokenizer = load_for_sampling(policy, policy.adapter_path)
    return HFGenerator(model, tokenizer, batch_size, style=policy.framing)
