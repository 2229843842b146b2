"""The typed record of a repair episode and what a batch of them says: turns per episode, the repair
rate (first program wrong or failing, final one right), the break rate (a right first program made
wrong), whether the second program read its feedback (`resample_lift`) and which kinds of feedback
were shown.

"Right" is the `correctness` component where the run has labels (at least `RIGHT_AT`: exact match
for a question, IoU 0.5 for a box) and otherwise the run's own check: a label-free run measures its
repairs by its unit tests, never by a label.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vprl.data.typed import check_row
from vprl.rewards.feedback import PARTS, Feedback

RIGHT_AT = 0.5


@dataclass(frozen=True)
class Turn:
    """One program of an episode, what it did, and the feedback it got (None on the last turn)."""

    program: str
    status: str
    answer: Any = None
    error: str | None = None
    total: float | None = None
    components: dict[str, float | None] = field(default_factory=dict)
    passed: bool = False  # the run's stop rule says it needs no repair
    feedback: Feedback | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def right(self) -> bool:
        value = self.components.get("correctness")
        if value is not None:
            return value >= RIGHT_AT
        return self.passed

    def to_json(self) -> dict[str, Any]:
        return {
            "program": self.program,
            "status": self.status,
            "answer": self.answer,
            "error": self.error,
            "total": self.total,
            "components": dict(self.components),
            "passed": self.passed,
            "feedback": self.feedback.to_json() if self.feedback else None,
            "tool_calls": list(self.tool_calls),
        }

    @classmethod
    def from_json(cls, row: Mapping[str, Any], where: str = "turn") -> Turn:
        row = dict(row)
        fb = row.pop("feedback", None)
        check_row(cls, row, where)
        return cls(**row, feedback=Feedback.from_json(fb) if fb else None)


@dataclass(frozen=True)
class Episode:
    """`shared_first`: the first program is a copy of the one of the nearest earlier episode of the
    same question in its batch (`repair_branches`: several later programs from one first program and
    its feedback), not a sample of its own."""

    example_id: str
    turns: tuple[Turn, ...]
    shared_first: bool = False

    @property
    def first(self) -> Turn:
        return self.turns[0]

    @property
    def final(self) -> Turn:
        return self.turns[-1]

    @property
    def repaired(self) -> bool:
        return not self.first.right() and self.final.right()

    @property
    def broken(self) -> bool:
        return self.first.right() and not self.final.right()

    def to_json(self) -> dict[str, Any]:
        row = {"example_id": self.example_id, "turns": [t.to_json() for t in self.turns]}
        return {**row, "shared_first": True} if self.shared_first else row

    @classmethod
    def from_json(cls, row: Mapping[str, Any], where: str = "episode") -> Episode:
        turns = tuple(Turn.from_json(t, f"{where}.turns[{i}]") for i, t in enumerate(row["turns"]))
        if not turns:
            raise ValueError(f"{where}: an episode has at least one turn")
        shared = row.get("shared_first", False)
        if not isinstance(shared, bool):
            raise ValueError(f"{where}.shared_first: expected true or false, got {shared!r}")
        return cls(str(row["example_id"]), turns, shared)


def episode_stats(episodes: Sequence[Episode]) -> dict[str, float]:
    """Per-batch figures (`repair/...` in the trainer's logs). A rate whose denominator is empty is
    left out rather than written as 0: no first program failed, so nothing could be repaired."""
    if not episodes:
        return {}
    n = len(episodes)
    out = {
        "repair/turns_mean": sum(len(e.turns) for e in episodes) / n,
        "repair/multi_turn_share": sum(len(e.turns) > 1 for e in episodes) / n,
        "repair/first_right": sum(e.first.right() for e in episodes) / n,
        "repair/final_right": sum(e.final.right() for e in episodes) / n,
    }
    wrong_first = [e for e in episodes if not e.first.right()]
    right_first = [e for e in episodes if e.first.right()]
    if wrong_first:
        out["repair/repair_rate"] = sum(e.repaired for e in wrong_first) / len(wrong_first)
    if right_first:
        out["repair/break_rate"] = sum(e.broken for e in right_first) / len(right_first)
    lift = resample_lift(episodes)
    if lift is not None:
        out["repair/resample_lift"] = lift
    shown = [t.feedback for e in episodes for t in e.turns if t.feedback is not None]
    if shown:
        kinds = Counter(p for fb in shown for p in fb.parts)
        for part in PARTS:
            out[f"repair/feedback_{part}"] = kinds[part] / len(shown)
    return out


def resample_lift(episodes: Sequence[Episode]) -> float | None:
    """How much more often a second program fixes a wrong first program than a fresh first program
    of the same question is right: the mean, over the episodes whose first program was wrong and got
    a second, of (second right) - (share of right first programs among the question's other first
    samples of the batch; a shared first program is its sample's, once). Near 0, the second turn is a
    resample that does not read its feedback (the repair rate alone cannot tell: wrong first programs
    are the hard questions'); positive, the feedback helps. None where no question has both such an
    episode and another sample. `episodes` in their batch's order (shared first programs follow theirs)."""
    samples: dict[str, list[bool]] = {}  # per question, each first sample's rightness
    sample_of: list[int] = []
    for k, e in enumerate(episodes):
        own = samples.setdefault(e.example_id, [])
        if e.shared_first and not own:
            raise ValueError(f"episode {k} ({e.example_id}) shares the first program of no earlier episode")
        if not e.shared_first:
            own.append(e.first.right())
        sample_of.append(len(own) - 1)
    lifts = []
    for e, sample in zip(episodes, sample_of, strict=True):
        own = samples[e.example_id]
        if len(e.turns) < 2 or e.first.right() or len(own) < 2:
            continue
        fresh = (sum(own) - own[sample]) / (len(own) - 1)  # this episode's own (wrong) sample left out
        lifts.append(float(e.turns[1].right()) - fresh)
    return sum(lifts) / len(lifts) if lifts else None
