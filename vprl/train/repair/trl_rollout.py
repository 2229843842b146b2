"""Repair episodes as trl's `rollout_func` (GRPO): one completion per row holding every turn, with
the feedback blocks masked out of the loss by `env_mask`.

Why `rollout_func` and not `environment_factory`: an environment's tools are called by the model
through its chat template's tool-call syntax, and what the policy writes here is not a tool call but
a whole program, run by our executor on a dataset example, with feedback that depends on the run's
reward (unit tests). `rollout_func` keeps the sampling in trl (its vLLM engine with weight sync and
its transformers path, through the trainer's own `_generate_single_turn`, so the stop rules and
the sampler's log-probabilities stay as they are for one-turn runs) and lets the episode loop
decide what comes between the turns. trl then forms the loss over the whole sequence with
`completion_mask * env_mask`: the feedback tokens carry no gradient and every program token of an
episode carries the episode's advantage (its group-relative reward).

The tokens are never re-tokenized: each turn's sampled ids are kept as sampled, a block's ids are
tokenized on their own and appended, and the next turn is generated from the concatenation. An
EOS the trainer appended to a turn that stopped at a stop sequence (never sampled) is dropped
before a block follows it, so the sequence trains EOS only where an episode ends.

With `branches` B > 1, each question's rows share a first program in blocks of B (sampled once per
block, with n / B samples asked per question): the rows of a block differ only in their later
programs, which so get a group-relative contrast of their own (docs/repair.md).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from vprl.data.records import Example
from vprl.rewards.feedback import Feedback
from vprl.train.online.sampler_logprobs import NOT_SAMPLED
from vprl.train.prompts import completion_to_program
from vprl.train.prompts.conversation import RepairFormat, opener_of
from vprl.train.repair.episode import Episode, episode_stats
from vprl.train.repair.turns import EpisodeLoop, episode_shaping

logger = logging.getLogger(__name__)

SHAPING_COLUMN = "repair_shaping"  # the extra field the shaping reward reads
FINAL_STATUS_COLUMN = "repair_final_status"


class RepairRollout:
    """Callable as `rollout_func(prompts, trainer)`. `on_episodes(episodes, step)` (optional) gets
    every batch's episodes (the run folder's `episodes.jsonl`)."""

    def __init__(
        self,
        loop: EpisodeLoop,
        examples: Mapping[str, Example],
        fmt: RepairFormat,
        id_column: str = "example_id",
        on_episodes: Any = None,
        branches: int = 1,
    ):
        if branches < 1:
            raise ValueError(f"repair_branches must be at least 1, got {branches}")
        self.branches = branches
        self.loop = loop
        self.examples = examples
        self.format = fmt
        self.id_column = id_column
        self.on_episodes = on_episodes
        self.last_episodes: list[Episode] = []
        self.last_sources: list[int] = []  # per row of the latest batch, the row whose first program it continues
        # The latest batches' episodes by (example, final program): a callback that sees a step's
        # rows after the next batch was sampled still finds them.
        self._recent: deque[dict[tuple[str, str], Episode]] = deque(maxlen=3)

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        inputs = trainer._batch_inputs  # set by ProgramTrainerMixin for this process's rows
        if inputs is None or len(inputs) != len(prompts):
            raise RuntimeError("the repair rollout needs the trainer's rows (ProgramTrainerMixin sets them)")
        try:
            examples = [self.examples[row[self.id_column]] for row in inputs]
        except KeyError as exc:
            raise KeyError(f"example id {exc.args[0]!r} of the batch is not among the training examples") from None
        tokenizer = trainer.processing_class
        prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
        training = trainer.model.training
        n = trainer.num_generations if training else trainer.num_generations_eval
        source = branch_sources([row[self.id_column] for row in inputs], self.branches)
        self.last_sources = source
        leaders = sorted(set(source))
        drawn, drawn_lps = _as_lists(
            *trainer._generate_single_turn([prompt_ids[i] for i in leaders], None, {}, max(1, n // self.branches))
        )
        at = {row: j for j, row in enumerate(leaders)}
        ids = [list(drawn[at[source[i]]]) for i in range(len(prompts))]
        logprobs = None if drawn_lps is None else [list(drawn_lps[at[source[i]]]) for i in range(len(prompts))]
        mask = [[1] * len(seq) for seq in ids]
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
        openers = [opener_of(p if isinstance(p, str) else str(p[-1]["content"])) for p in prompts]
        first = [completion_to_program(p, t) for p, t in zip(prompts, texts, strict=True)]
        eos, turn_end = tokenizer.eos_token_id, set(getattr(trainer, "stop_token_ids", ()))

        def next_programs(rows: list[int], feedbacks: list[Feedback]) -> list[str | None]:
            contexts = []
            for i, fb in zip(rows, feedbacks, strict=True):
                if ids[i] and ids[i][-1] == eos and (logprobs is None or logprobs[i][-1] is NOT_SAMPLED):
                    for seq in (ids[i], mask[i], *([logprobs[i]] if logprobs is not None else [])):
                        seq.pop()
                ended = bool(ids[i]) and ids[i][-1] in turn_end
                newline = tokenizer.decode(ids[i], skip_special_tokens=True).endswith("\n")
                block = self.format.block_ids(fb, openers[i], after_turn_end=ended, after_newline=newline)
                ids[i] += block
                mask[i] += [0] * len(block)
                if logprobs is not None:
                    logprobs[i] += [NOT_SAMPLED] * len(block)
                contexts.append(prompt_ids[i] + ids[i])
            fresh, fresh_lps = _as_lists(*trainer._generate_single_turn(contexts, None, {}, 1))
            out = []
            for k, i in enumerate(rows):
                ids[i] += fresh[k]
                mask[i] += [1] * len(fresh[k])
                if logprobs is not None:
                    logprobs[i] += fresh_lps[k]
                out.append(completion_to_program(openers[i], tokenizer.decode(fresh[k], skip_special_tokens=True)))
            return out

        episodes = [
            replace(e, shared_first=True) if source[i] != i else e
            for i, e in enumerate(self.loop.run(examples, first, next_programs))
        ]
        self.last_episodes = episodes
        self._recent.append({(e.example_id, e.final.program): e for e in episodes})
        mode = "train" if training else "eval"
        for key, value in episode_stats(episodes).items():
            trainer._metrics[mode][key].append(value)
        if self.on_episodes is not None:
            # the optimizer step these episodes train, as the rollouts log numbers its rows
            self.on_episodes(episodes, int(trainer.state.global_step) + 1)
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": ids,
            "logprobs": logprobs,
            "env_mask": mask,
            SHAPING_COLUMN: [episode_shaping(e, self.loop.config) for e in episodes],
            FINAL_STATUS_COLUMN: [e.final.status for e in episodes],
        }

    def earlier_turns(self, example_id: str, program: str) -> str:
        """The turns before the one that wrote `program` for `example_id`, each with its feedback,
        as text; empty for a program written first (or no longer among the latest batches)."""
        for batch in reversed(self._recent):
            episode = batch.get((example_id, program))
            if episode is not None:
                return "\n\n".join(
                    f"turn {k + 1} ({t.status}):\n{t.program}\nfeedback:\n{t.feedback.text if t.feedback else ''}"
                    for k, t in enumerate(episode.turns[:-1])
                )
        return ""


def branch_sources(example_ids: list[str], branches: int) -> list[int]:
    """For each row, the row whose first program it continues: each question's rows, in order, in
    blocks of `branches` that share their first row's program (each row writes its own later ones).
    A question's rows must come in whole blocks."""
    rows: dict[str, list[int]] = {}
    for i, example in enumerate(example_ids):
        rows.setdefault(example, []).append(i)
    source = list(range(len(example_ids)))
    for example, own in rows.items():
        if len(own) % branches:
            raise ValueError(
                f"repair_branches {branches}: question {example!r} has {len(own)} rows in this process's batch, "
                "not whole blocks; make num_generations and per_device_train_batch_size multiples of it"
            )
        for start in range(0, len(own), branches):
            for i in own[start : start + branches]:
                source[i] = own[start]
    return source


def _as_lists(ids: Any, logprobs: Any = None) -> tuple[list[list[int]], list[list[float | None]] | None]:
    return [list(s) for s in ids], None if logprobs is None else [list(lp) for lp in logprobs]


def repair_shaping(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """A reward function (weight 1): the episode's shaping (`episode_shaping`: its turn and repeat
    costs) from the rollout's extra field; None where the final program was never judged, as the
    total is then."""
    shaping, statuses = kwargs[SHAPING_COLUMN], kwargs[FINAL_STATUS_COLUMN]
    return [None if s == "infra_error" else float(v) for v, s in zip(shaping, statuses, strict=True)]
