"""`episodes.jsonl`: every repair episode of a run, one row each with the optimizer step it trains
(its turns' programs, what they did, the feedback shown), what the run viewer shows side by side.
Each process appends its own rows; a process other than the first writes `episodes.rank<N>.jsonl`.
A resumed run cuts every such file back to its checkpoint's step (`truncate_after`), as it does its
rollouts and metrics, so the steps it replays are logged once."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from vprl.train.repair.episode import Episode
from vprl.train.runs.jsonl import cut_rows, read_rows, up_to

EPISODES_FILE = "episodes.jsonl"


def episodes_path(run_dir: str | Path, rank: int = 0) -> Path:
    name = EPISODES_FILE if rank == 0 else f"episodes.rank{rank}.jsonl"
    return Path(run_dir) / name


def episode_logs(run_dir: str | Path) -> list[Path]:
    """Every process's episodes file in `run_dir`."""
    return sorted(Path(run_dir).glob("episodes.jsonl")) + sorted(Path(run_dir).glob("episodes.rank*.jsonl"))


class EpisodeLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __call__(self, episodes: Sequence[Episode], step: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            for episode in episodes:
                f.write(json.dumps({"step": step, **episode.to_json()}, default=str) + "\n")

    def read(self) -> Iterator[tuple[int, Episode]]:
        yield from read_rows(self.path, _parse)

    def truncate_after(self, step: int | None) -> int:
        """Keep the rows of steps <= `step` (none when None), without a torn last line; returns how
        many rows went."""
        return cut_rows(self.path, up_to(step, lambda row: int(row["step"])), lambda row: json.dumps(row, default=str))


def _parse(row: dict, where: str) -> tuple[int, Episode]:
    row = dict(row)
    step = row.pop("step")
    return int(step), Episode.from_json(row, where)
