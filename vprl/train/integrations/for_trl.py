"""vprl's rewards in your own trl script: sandboxed execution against the vision tools, scored by
any rewards of the registry (correctness, visual unit tests, verifiers).

    examples = load_examples("shapes", "world", tasks=["train"])    # python -m vprl.data.shapes --out world
    with program_rewards(["correctness", "unit_tests"], tool_stack="shapes") as rewards:
        trainer = GRPOTrainer(model=..., reward_funcs=rewards.funcs, train_dataset=trl_dataset(examples),
                              args=GRPOConfig(..., reward_weights=rewards.weights))
        trainer.train()

What trl sees, per trl's reward-function contract `(prompts, completions, **columns) -> list[float |
None]` (plain text or conversational, both):

- one function per reward, named after it, with the reward's weight in `rewards.weights`: its value
  for a program that ran (None where the reward had nothing to say), 0 for one that failed to run
  (it answered nothing; `rewards/<name>/mean` then means what it means under `vprl/train/rl.py`);
- `failure_penalty` (weight 1): the status penalty of a program that failed (syntax error,
  runtime error, timeout, ...), None for one that ran.

trl's weighted sum over what is not None is then exactly vprl's composed total
(`vprl.rewards.compose`), and a completion for which everything is None (our own failure,
`infra_error`, or no reward could judge it) is unscorable: out of the group baseline, advantage 0.
Every function shares one execution of the batch (`vprl.rewards.trl_adapter`); the executor starts on
the first batch (or `start()`) and closes at exit or at the end of the `with` block.

The dataset carries each example as JSON in the `vprl_example` column, so the rewards need nothing
else; `trl_dataset` builds it with vprl's prompts.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vprl.data.records import Example
from vprl.data.retired_names import retired_message
from vprl.executor.results import PROGRAM_FAILURES
from vprl.executor.runner_config import RunnerConfig
from vprl.executor.settings import ExecutorArgs
from vprl.rewards.trl_adapter import Scored, TrlRewardAdapter
from vprl.train.integrations.session import ScoringSession, SessionConfig, reward_config
from vprl.train.prompts import PromptConfig, completion_to_program
from vprl.train.prompts.conversation import final_program
from vprl.train.recipe.data import build_prompts, trl_prompt_text

EXAMPLE_COLUMN = "vprl_example"
FAILURE_PENALTY = "failure_penalty"
SHAPES = "shapes"


def load_examples(
    dataset: str, root: str, split: str | None = None, tasks: Sequence[str] | None = None, **options: Any
) -> list[Example]:
    """A dataset's examples from its official layout (`vprl.data.loaders`), or the shapes world's tasks
    (`dataset="shapes"`, `tasks` such as ["train"]; `python -m vprl.data.shapes --out DIR` makes one)."""
    if dataset == SHAPES:
        if split is not None or options:
            raise ValueError("load_examples: the shapes world takes tasks=[...], no split and no options")
        from vprl.data.shapes.tasks import load_shapes_tasks

        loaded = load_shapes_tasks(root, list(tasks or ["train"]))
        return [ex for name in loaded for ex in loaded[name]]
    if tasks is not None:
        raise ValueError(f"load_examples: tasks= chooses the shapes world's tasks; {dataset!r} takes a split")
    from vprl.data.loaders import load_dataset

    return load_dataset(dataset, root, split, **options)


def trl_dataset(
    examples: Sequence[Example],
    tokenizer: Any = None,
    framing: str = "auto",
    conversational: bool = False,
    **prompt: Any,
):
    """A `datasets.Dataset` with `prompt` (vprl's prompt for each example's task) and `vprl_example`.

    `prompt` settings are `PromptConfig`'s (variant, layout, ice_file, ...). The prompt is plain text
    ending with the entry point's signature, so a completion is the function's body; with a
    `tokenizer` it is framed for that model (a chat template, one BOS); `conversational` makes it
    one user message instead, for trl to apply the chat template."""
    from datasets import Dataset

    if not examples:
        raise ValueError("trl_dataset: no examples")
    if conversational and tokenizer is not None:
        raise ValueError("trl_dataset: conversational prompts are framed by trl; pass no tokenizer")
    try:
        configs = {task: PromptConfig(task=task, **prompt) for task in sorted({ex.task for ex in examples})}
    except TypeError as exc:
        raise ValueError(f"trl_dataset: {exc} (prompt settings are PromptConfig's fields)") from None
    rows = []
    for p in build_prompts(list(examples), configs):
        if conversational:
            text: Any = [{"role": "user", "content": p.prompt}]
        else:
            text = trl_prompt_text(p.prompt, tokenizer, framing) if tokenizer is not None else p.prompt
        rows.append({"prompt": text, EXAMPLE_COLUMN: json.dumps(p.example.to_json(), sort_keys=True)})
    return Dataset.from_list(rows)


@functools.lru_cache(maxsize=65536)
def _example(row: str) -> Example:
    try:
        return Example.from_json(json.loads(row), where=f"dataset column {EXAMPLE_COLUMN!r}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"dataset column {EXAMPLE_COLUMN!r}: not an example's JSON ({exc.msg})") from None


class ExamplesFromColumn:
    """What the adapter looks examples up in: the column's value is the example itself."""

    def __getitem__(self, row: str) -> Example:
        return _example(row)


class _PerRewardAdapter(TrlRewardAdapter):
    """Each reward its own trl function, trl applying the weights, plus the failure penalty."""

    def __init__(self, session: ScoringSession, weights: Sequence[float], to_program: Any = completion_to_program):
        names = [spec.name for spec in session.config.rewards.rewards]
        if FAILURE_PENALTY in names:
            raise ValueError(f"a reward may not be called {FAILURE_PENALTY!r}: that name is the failure penalty's")
        super().__init__(session, ExamplesFromColumn(), to_program, names, id_column=EXAMPLE_COLUMN)
        self.weights = list(weights)

    @property
    def reward_funcs(self) -> list:
        funcs = [self._make(name, lambda s, i, name=name: _value(s, name, i)) for name in self.components]
        return [*funcs, self._make(FAILURE_PENALTY, _penalty)]

    @property
    def reward_weights(self) -> list[float]:
        return [*self.weights, 1.0]


def _value(scored: Scored, name: str, i: int) -> float | None:
    failed = scored.rewards.statuses[i] in PROGRAM_FAILURES
    return 0.0 if failed else scored.rewards.components[name][i]


def _penalty(scored: Scored, i: int) -> float | None:
    return scored.rewards.totals[i] if scored.rewards.statuses[i] in PROGRAM_FAILURES else None


class ProgramRewards:
    """trl reward functions over one vprl scoring session: `funcs` and `weights` for the trainer."""

    def __init__(self, config: SessionConfig, episodes: bool = False):
        self.session = ScoringSession(config)
        self.episodes = episodes  # completions are repair episodes: each is scored by its final program
        to_program = final_program if episodes else completion_to_program
        weights = [spec.weight for spec in config.rewards.rewards]
        self.adapter = _PerRewardAdapter(self.session, weights, to_program)
        self.names = [*self.adapter.components, FAILURE_PENALTY]
        self.weights = self.adapter.reward_weights
        self.funcs = [self._checked(fn) for fn in self.adapter.reward_funcs]
        self._weights_checked = False

    def _checked(self, fn: Any) -> Any:
        async def reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
            if EXAMPLE_COLUMN not in columns:
                raise ValueError(
                    f"the training dataset has no {EXAMPLE_COLUMN!r} column: build it with "
                    "vprl.train.integrations.for_trl.trl_dataset(examples)"
                )
            if not self._weights_checked:
                self._check_weights(columns.get("log_metric"))
            return await fn(prompts, completions, **columns)

        reward.__name__ = reward.__qualname__ = fn.__name__
        return reward

    def _check_weights(self, log_metric: Any) -> None:
        """trl weights every function by `GRPOConfig.reward_weights` (1 when unset): refuse a run
        that weighs vprl's rewards otherwise than they were built with. The trainer is reached
        through the `log_metric` it hands its reward functions; without it there is nothing to see."""
        trainer = getattr(log_metric, "__self__", None)
        funcs, weights = getattr(trainer, "reward_funcs", None), getattr(trainer, "reward_weights", None)
        if funcs is None or weights is None:
            return
        applied = {id(f): float(w) for f, w in zip(funcs, list(weights), strict=True)}
        ours = [applied.get(id(f)) for f in self.funcs]
        if any(a is not None and abs(a - w) > 1e-6 for a, w in zip(ours, self.weights, strict=True)):
            raise ValueError(
                f"trl weighs vprl's rewards {self.names} by {ours}, but they were built with {self.weights}: "
                "pass GRPOConfig(reward_weights=rewards.weights), or give the weights to program_rewards"
            )
        self._weights_checked = True

    def start(self) -> ProgramRewards:
        """Start the executor now (else the first batch starts it), e.g. before loading the policy."""
        self.session.start()
        return self

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> ProgramRewards:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def program_rewards(
    rewards: Any = "correctness",
    tool_stack: str | Path | dict[str, Any] = SHAPES,
    penalties: dict[str, float] | None = None,
    tool_service: str | None = None,
    tool_overrides: dict[str, Any] | None = None,
    runner: RunnerConfig | None = None,
    run_dir: str | None = None,
    executor: ExecutorArgs | None = None,
    episodes: bool = False,
    **retired: Any,
) -> ProgramRewards:
    """trl reward functions for registry rewards: `rewards` is a name, names, `{name: weight}` or a
    recipe's `[{name, weight, settings}]`; `tool_stack` a stack's name ("shapes", "viunit", ...), path
    or settings; `penalties` the status penalties over `vprl.rewards.compose.DEFAULT_PENALTIES`;
    `tool_service` the Ray address of the tools deployed as a service; `runner` the sandbox's
    settings (slots, timeouts, isolation); `run_dir` where rewards keep files (unit-test cache).
    `executor`, the recipe's executor section (`vprl.ExecutorArgs`), gives the stack, its overrides
    and service and the sandbox's settings at once, under the names every command uses.
    `episodes`: the completions are repair episodes (`vprl.train.integrations.trl_episodes`), each
    scored by its final program."""
    for name in retired:
        raise TypeError(f"program_rewards: {retired_message(name) or f'unexpected keyword argument {name!r}'}")
    if executor is not None:
        given = [name for name, value in (("tool_service", tool_service), ("tool_overrides", tool_overrides),
                                          ("runner", runner)) if value is not None]  # fmt: skip
        if given or tool_stack != SHAPES:
            raise TypeError(f"program_rewards: give `executor` or {', '.join(given) or 'tool_stack'}, not both")
        tool_stack, tool_service = executor.tool_stack, executor.tool_service
        tool_overrides, runner = executor.tool_overrides, executor.runner_config()
    config = SessionConfig(
        rewards=reward_config(rewards, penalties),
        tool_stack=tool_stack if isinstance(tool_stack, dict) else str(tool_stack),
        tool_service=tool_service,
        tool_overrides=dict(tool_overrides or {}),
        runner=runner or RunnerConfig(),
        run_dir=run_dir,
    )
    return ProgramRewards(config, episodes)


__all__ = ["EXAMPLE_COLUMN", "FAILURE_PENALTY", "ProgramRewards", "load_examples", "program_rewards", "trl_dataset"]
