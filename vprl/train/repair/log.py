"""`episodes.jsonl`: every repair episode of a run, one row each with the optimizer step it trains
(its turns' programs, what they did, the feedback shown), what the run viewer shows side by side.
Each process appends its own rows; a process other than the first writes `episodes.rank<N>.jsonl`."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from vprl.train.repair.episode import Episode

EPISODES_FILE = "episodes.jsonl"


def episodes_path(run_dir: str | Path, rank: int = 0) -> Path:
    name = EPISODES_FILE if rank == 0 else f"episodes.rank{rank}.jsonl"
    return Path(run_dir) / name


class EpisodeLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __call__(self, episodes: Sequence[Episode], step: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            for episode in episodes:
                f.write(json.dumps({"step": step, **episode.to_json()}, default=str) + "\n")

    def read(self) -> Iterator[tuple[int, Episode]]:
        if not self.path.exists():
            return
        with self.path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    row = json.loads(line)
                    step = row.pop("step")
                    yield int(step), Episode.from_json(row, f"{self.path}:{n}")
