"""The episode loop over a batch: score every row's program, give feedback to those the stop rule
does not accept, have the policy write the next program for them, until every episode ended or
`max_turns` programs were written.

The loop is generic in how the next program comes: `next_programs(rows, feedbacks)` returns, for
each row still going, its next program (or None: the row cannot go on, e.g. its token budget is
spent). trl's rollout keeps token sequences behind it (`trl_rollout`); the evaluation's `repair`
mode builds text prompts. Every turn is scored through the same `ProgramScorer` (the run's runner,
tool host and cache, and its composed reward), so a turn's feedback and its reward see the same run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from vprl.data.records import Example
from vprl.executor.program import program_key
from vprl.rewards.feedback import Feedback, FeedbackConfig, turn_feedback
from vprl.train.repair.episode import Episode, Turn
from vprl.train.rollouts.scorer import ProgramScorer, ScoredBatch

NextPrograms = Callable[[list[int], list[Feedback]], Sequence[str | None]]
# What a repair episode's first-program tokens carry (`repair_first_credit`; vprl.train.repair.turn_advantage).
FIRST_CREDITS = ("episode", "own", "both", "none")
# What its later programs' tokens carry (`repair_later_credit`; the same module).
LATER_CREDITS = ("episode", "fresh")


@dataclass(frozen=True)
class RepairConfig:
    """max_turns: programs per episode at most (1: one program, no repair). turn_cost: subtracted
    from the episode's reward for each turn after the first. repeat_cost: subtracted for each later
    program that is an earlier one of its episode again (the same AST): the executor is
    deterministic, so a repeat fails as it did, a turn spent without reading its feedback. After RL
    the greedy second program was the first again in a third of the benchmark's episodes
    (docs/repair.md); the cost tells a repeat from a different try that also failed, and, unlike a
    bonus for the final program's gain over the first, never pays for a first program written
    wrong (every turn's tokens carry the episode's one advantage)."""

    max_turns: int = 2
    turn_cost: float = 0.0
    feedback: FeedbackConfig = FeedbackConfig()
    repeat_cost: float = 0.0

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"repair_max_turns must be at least 1, got {self.max_turns}")
        if self.turn_cost < 0:
            raise ValueError(f"repair_turn_cost must be >= 0, got {self.turn_cost}")
        if self.repeat_cost < 0:
            raise ValueError(f"repair_repeat_cost must be >= 0, got {self.repeat_cost}")


def repeats(episode: Episode) -> int:
    """The episode's later programs that are an earlier one of it again (formatting and comments
    aside: `program_key`)."""
    seen: set[str] = set()
    count = 0
    for turn in episode.turns:
        key = program_key(turn.program)
        count += key in seen
        seen.add(key)
    return count


def episode_shaping(episode: Episode, config: RepairConfig) -> float:
    """What the episode's reward adds to its final program's: the costs of its extra turns and of
    its repeats (0 for a one-turn episode)."""
    return -config.turn_cost * (len(episode.turns) - 1) - config.repeat_cost * repeats(episode)


def episode_reward(episode: Episode, config: RepairConfig) -> float | None:
    """The final program's total with the episode's shaping; None where the final program was never
    judged (our own failure)."""
    total = episode.final.total
    return None if total is None else total + episode_shaping(episode, config)


def judged_turn(
    config: FeedbackConfig, program: str, scored: ScoredBatch, j: int, last: bool, question: str = ""
) -> Turn:
    """Row `j` of a scored batch as an episode's turn: what it did, whether the stop rule accepts
    it, and its feedback (None on the `last` turn, or when it needs none; `question`, the example's
    query, for the `unasked` part). The one place a turn is judged: the batch loop below and verl's
    agent loop (one episode at a time) both call it."""
    result, rewards = scored.results[j], scored.rewards
    components = {name: values[j] for name, values in rewards.components.items()}
    tests = rewards.details.get("unit_tests")
    return Turn(
        program=program,
        status=result.status,
        answer=result.answer,
        error=result.error,
        total=rewards.totals[j],
        components=components,
        passed=config.passed(result, components),
        feedback=None
        if last
        else turn_feedback(config, result, components, tests[j] if tests else (), program, question),
        tool_calls=[c.to_json() for c in result.tool_calls],
    )


class EpisodeLoop:
    def __init__(self, scorer: ProgramScorer, config: RepairConfig):
        self.scorer = scorer
        self.config = config

    def run(self, examples: Sequence[Example], programs: Sequence[str], next_programs: NextPrograms) -> list[Episode]:
        if len(examples) != len(programs):
            raise ValueError(f"got {len(examples)} examples and {len(programs)} first programs")
        turns: list[list[Turn]] = [[] for _ in examples]
        rows, current = list(range(len(examples))), list(programs)
        for k in range(self.config.max_turns):
            scored = self.scorer.score([examples[i] for i in rows], current)
            going: list[tuple[int, Feedback]] = []
            last = k == self.config.max_turns - 1
            for j, i in enumerate(rows):
                turns[i].append(judged_turn(self.config.feedback, current[j], scored, j, last, examples[i].query))
                if turns[i][-1].feedback is not None:
                    going.append((i, turns[i][-1].feedback))
            if not going:
                break
            fresh = list(next_programs([i for i, _ in going], [fb for _, fb in going]))
            if len(fresh) != len(going):
                raise ValueError(f"next_programs returned {len(fresh)} programs for {len(going)} rows")
            kept = [(i, p) for (i, _), p in zip(going, fresh) if p is not None]
            for (i, _), p in zip(going, fresh):
                if p is None:  # it could not go on: its feedback was never shown
                    turns[i][-1] = replace(turns[i][-1], feedback=None)
            if not kept:
                break
            rows, current = [i for i, _ in kept], [p for _, p in kept]
        return [Episode(e.id, tuple(t)) for e, t in zip(examples, turns)]
