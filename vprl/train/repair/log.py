"""`episodes.jsonl`: every repair episode of a run, one row each with the optimizer step it trains
(its turns' programs, what they did, the feedback shown), what the run viewer shows side by side.
Each process appends its own rows; a process other than the first writes `episodes.rank<N>.jsonl`.
A resumed run cuts every such file back to its checkpoint's step (`truncate_after`), as it does its
rollouts and metrics, so the steps it replays are logged once."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

from vprl.train.repair.episode import Episode

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
        for n, row in self._rows():
            step = row.pop("step")
            yield int(step), Episode.from_json(row, f"{self.path}:{n}")

    def _rows(self) -> Iterator[tuple[int, dict]]:
        """(line number, row) of every whole row. A torn last line (a write a kill cut short) is
        dropped with a warning, as the rollouts log does; a bad line elsewhere names its place."""
        if not self.path.exists():
            return
        lines = self.path.read_text(encoding="utf-8").split("\n")
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as e:
                if n < len(lines):
                    raise ValueError(f"{self.path}:{n}: not valid JSON ({e})") from None
                warnings.warn(f"{self.path}:{n}: dropping a torn last line ({e})", stacklevel=3)

    def truncate_after(self, step: int | None) -> int:
        """Keep the rows of steps <= `step` (none when None), without a torn last line; returns how
        many rows went."""
        if not self.path.is_file():
            return 0
        rows = [row for _, row in self._rows()]
        keep = [row for row in rows if step is not None and int(row["step"]) <= step]
        text = "".join(json.dumps(row, default=str) + "\n" for row in keep)
        if text != self.path.read_text(encoding="utf-8"):
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, self.path)
        return len(rows) - len(keep)
