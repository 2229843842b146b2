"""A repair run's earlier turns on its cards: each card is an episode's final program (what the
rollouts log holds); `episodes.jsonl` (one per process) holds every episode with its turns. The
turns before the final one, each with its status, answer, error, tool calls and the feedback it
was shown, go on the card so the page draws them side by side with the final program."""

from __future__ import annotations

from collections import defaultdict, deque
from pathlib import Path
from typing import Any

from vprl.train.repair.episode import Turn
from vprl.train.repair.log import EpisodeLog, episode_logs
from vprl.train.view.cards import show
from vprl.train.view.traces import call_marks


def attach_turns(cards: list[dict[str, Any]], run: Path) -> int:
    """Adds `turns` to every card whose episode had more than one; returns how many got them.

    A group may hold the same final program twice (one repaired, one written first): both logs keep
    the batch's order, so the n-th episode of a (step, example, program) is the n-th such card."""
    wanted: dict[tuple, deque[dict[str, Any]]] = defaultdict(deque)
    for c in cards:
        wanted[c.get("s"), c.get("e"), c.get("prog")].append(c)
    found = 0
    for path in episode_logs(run):
        for step, episode in EpisodeLog(path).read():
            queue = wanted.get((step, episode.example_id, episode.final.program))
            if not queue:
                continue
            card = queue.popleft()
            if len(episode.turns) > 1:
                card["turns"] = [_turn(t) for t in episode.turns[:-1]]
                found += 1
    return found


def _turn(turn: Turn) -> dict[str, Any]:
    return {
        "prog": turn.program,
        "st": turn.status,
        "ans": None if turn.answer is None else show(turn.answer),
        "err": turn.error,
        "feedback": turn.feedback.text if turn.feedback is not None else None,
        "calls": [m.to_json() for m in call_marks(turn.program, turn.tool_calls, None)],
    }
