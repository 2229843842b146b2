"""The episode log of repair runs (#35): it reads back what it wrote, drops a torn last line, names
the line of a bad row, and a resumed run cuts it back to its checkpoint with the other logs."""

from __future__ import annotations

import pytest

from vprl.train.repair.episode import Episode, Turn
from vprl.train.repair.log import EpisodeLog, episodes_path


def _turn(right: bool) -> Turn:
    return Turn("p", "ok", total=1.0 if right else 0.0, components={"correctness": float(right)}, passed=right)


def test_the_episode_log_reads_back_what_it_wrote(tmp_path):
    log = EpisodeLog(tmp_path / "episodes.jsonl")
    episode = Episode("a", (_turn(True),))
    log([episode], 3)
    assert list(log.read()) == [(3, episode)]


def test_the_episode_log_is_cut_back_for_resume_and_drops_a_torn_tail(tmp_path):
    log = EpisodeLog(tmp_path / "episodes.jsonl")
    assert list(log.read()) == [] and log.truncate_after(3) == 0
    episodes = [Episode(f"e{i}", (_turn(i % 2 == 0),)) for i in range(2)]
    for step in range(1, 5):
        log(episodes, step)
    with open(log.path, "a") as f:
        f.write('{"step": 5, "example_id": "e0", "tur')  # killed mid-write
    with pytest.warns(UserWarning, match="torn last line"):
        assert [s for s, _ in log.read()] == [1, 1, 2, 2, 3, 3, 4, 4]
    with pytest.warns(UserWarning):
        assert log.truncate_after(2) == 4
    assert list(log.read()) == [(1, episodes[0]), (1, episodes[1]), (2, episodes[0]), (2, episodes[1])]
    assert log.path.read_text().endswith("\n")
    assert log.truncate_after(None) == 4 and list(log.read()) == []


def test_the_episode_log_names_the_line_of_a_bad_row(tmp_path):
    log = EpisodeLog(tmp_path / "episodes.jsonl")
    log([Episode("a", (_turn(True),))], 1)
    with open(log.path, "a") as f:
        f.write("not json\n")
    log([Episode("a", (_turn(True),))], 2)
    with pytest.raises(ValueError, match=r"episodes.jsonl:2: not valid JSON"):
        list(log.read())


def test_a_resume_cuts_every_log_of_the_run_back_to_its_checkpoint(tmp_path):
    """Rollouts, metrics and every process's episodes: the steps a resumed run replays are logged once."""
    from vprl.train.rl import cut_logs_back
    from vprl.train.rollouts.log import RolloutLog, RolloutRow
    from vprl.train.runs.folder import MetricsLog

    episodes = {rank: EpisodeLog(episodes_path(tmp_path, rank)) for rank in (0, 1)}
    for step in range(1, 6):
        RolloutLog.in_run(tmp_path).append(
            [RolloutRow(step=step, example_id="e", prompt_hash="h", program="p", status="ok", total=1.0)]
        )
        MetricsLog(tmp_path).append({"step": step, "loss": 0.1})
        for log in episodes.values():
            log([Episode("e", (_turn(True),))], step)
    assert cut_logs_back(tmp_path, 3) == 4 * 2
    assert [r.step for r in RolloutLog.in_run(tmp_path).read()] == [1, 2, 3]
    assert [r["step"] for r in MetricsLog(tmp_path).read()] == [1, 2, 3]
    assert {rank: [s for s, _ in log.read()] for rank, log in episodes.items()} == {0: [1, 2, 3], 1: [1, 2, 3]}
    assert cut_logs_back(tmp_path, None) == 3 * 4
