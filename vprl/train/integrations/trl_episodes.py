"""Repair episodes in your own trl script (GRPO): the policy's program runs, the feedback of its run
comes back, the policy writes it again; trl trains the whole exchange with the feedback masked out.

    with program_rewards(["correctness"], episodes=True) as rewards:
        rollout = repair_rollout(rewards, tokenizer, max_turns=2, stop_when="ran")
        trainer = with_episode_rows(GRPOTrainer)(
            model=..., reward_funcs=rewards.funcs, rollout_func=rollout, train_dataset=trl_dataset(examples),
            args=GRPOConfig(..., reward_weights=rewards.weights),
        )

`repair_rollout` is trl's `rollout_func` (vprl's `RepairRollout`, the one `vprl/train/rl.py` trains
with): every turn is sampled by the trainer's own `_generate_single_turn` (vLLM or transformers) and
run by the rewards' executor, and the rewards score each episode's final program. trl hands a
`rollout_func` the prompts only, and an episode needs its row's example (the `vprl_example` column:
two rows may ask the same question of different images): `with_episode_rows` gives the trainer
class the one method that hands the rollout the rows. docs/repair.md says what a turn shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vprl.rewards.feedback import FeedbackConfig
from vprl.train.integrations.for_trl import EXAMPLE_COLUMN, ExamplesFromColumn, ProgramRewards
from vprl.train.prompts.conversation import RepairFormat
from vprl.train.repair.trl_rollout import RepairRollout
from vprl.train.repair.turns import EpisodeLoop, RepairConfig


def repair_rollout(
    rewards: ProgramRewards,
    tokenizer: Any,
    max_turns: int = 2,
    stop_when: str = "ran",
    check: str | None = None,
    pass_threshold: float = 1.0,
    show: Sequence[str] = ("error", "trace", "unit_tests"),
    framing: str = "plain",
) -> RepairRollout:
    """trl's `rollout_func` playing episodes of up to `max_turns` programs over `rewards`' executor
    and rewards: an episode ends at the first program that runs (`stop_when="ran"`) or that scores at
    least `pass_threshold` on the reward `check` (`"passed"`); a message shows the parts in `show`
    (`error`, `trace`, `unit_tests`, `verdict`). `framing` is the prompt's (`plain`, or `chat` for a
    chat template's turns). `rewards` must be built with `episodes=True`."""
    if not rewards.episodes:
        raise ValueError("repair_rollout: build the rewards with program_rewards(..., episodes=True) so that they "
                         "score each episode's final program")  # fmt: skip
    if check is not None and check not in rewards.adapter.components:
        raise ValueError(f"repair_rollout: check {check!r} is not one of the rewards {rewards.adapter.components}")
    feedback = FeedbackConfig(stop_when=stop_when, check=check, pass_threshold=pass_threshold, show=tuple(show))
    loop = EpisodeLoop(rewards.session.start(), RepairConfig(max_turns, 0.0, feedback))
    return RepairRollout(loop, ExamplesFromColumn(), RepairFormat(tokenizer, framing), id_column=EXAMPLE_COLUMN)


class EpisodeRows:
    """Mixed in front of a trl trainer: the rows of each generation batch, for the rollout."""

    _batch_inputs: list[dict[str, Any]] | None = None

    def _generate_and_score_completions(self, inputs):
        self._batch_inputs = inputs
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            self._batch_inputs = None


def with_episode_rows(trainer_class: type) -> type:
    """`trainer_class` (e.g. trl's GRPOTrainer) with `EpisodeRows` mixed in."""
    return type(f"Episode{trainer_class.__name__}", (EpisodeRows, trainer_class), {})


__all__ = ["EpisodeRows", "repair_rollout", "with_episode_rows"]
