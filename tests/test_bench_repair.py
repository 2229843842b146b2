"""bench/repair.py's bookkeeping, which a days-long benchmark leans on: one call per seed side by
side, collected into one folder once (records never doubled, the evaluation world brought along), and
the repair-rate summary that says whether training collapsed, and the second program's lift over a
fresh sample per step, read back from the run's episode logs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.repair import collect, records  # noqa: E402
from bench.repair_report import curve_summary, lift_curve  # noqa: E402
from vprl.rewards.feedback import Feedback  # noqa: E402
from vprl.train.repair.episode import Episode, Turn  # noqa: E402
from vprl.train.repair.log import EpisodeLog, episodes_path  # noqa: E402


def _folder(root: Path, seed: int) -> Path:
    out = root / f"repair_s{seed}"
    (out / "shapes_eval").mkdir(parents=True)
    (out / "shapes_eval" / "manifest.json").write_text(json.dumps({"config": {"seed": 1}}))
    rows = [{"seed": seed, "arm": arm, "run_dir": str(out / f"seed{seed}" / arm)} for arm in ("single", "repair")]
    (out / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_collect_joins_each_record_once_and_brings_the_evaluation_world(tmp_path):
    folders = [_folder(tmp_path, seed) for seed in (0, 1)]
    out = tmp_path / "repair"
    out.mkdir()
    for _ in range(2):  # a second collect (a resumed call) adds nothing
        for folder in folders:
            collect(folder, out)
    got = records(out / "runs.jsonl")
    assert sorted((r["seed"], r["arm"]) for r in got) == [(0, "repair"), (0, "single"), (1, "repair"), (1, "single")]
    assert json.loads((out / "shapes_eval" / "manifest.json").read_text()) == {"config": {"seed": 1}}
    with pytest.raises(FileNotFoundError, match="missing has no runs.jsonl"):
        collect(tmp_path / "missing", out)


def test_the_repair_rate_summary_shows_a_collapse():
    steady = [(i, 0.3 + 0.001 * i) for i in range(60)]
    collapsed = [(i, 0.3 if i < 20 or i >= 40 else 0.0) for i in range(60)]
    rows = curve_summary([steady, collapsed])["per_seed"]
    assert rows[0]["lowest_after_first"] > rows[0]["first"]
    assert rows[1]["first"] == rows[1]["last"] == 0.3 and rows[1]["lowest_after_first"] == 0.0


def test_the_lift_curve_is_each_steps_resample_lift_over_every_process_log(tmp_path):
    fb = Feedback(("error",), "It failed")

    def episode(first: bool, second: bool | None = None) -> Episode:
        right = {"correctness": 1.0}
        wrong = {"correctness": 0.0}
        if second is None:
            return Episode("q", (Turn("p", "ok", components=right if first else wrong),))
        turns = (
            Turn("p", "ok", components=wrong, feedback=fb),
            Turn("p", "ok", components=right if second else wrong),
        )
        return Episode("q", turns)

    # step 1 over both processes' logs: each wrong first program's others are 1 right of 2, so +0.5 and -0.5
    EpisodeLog(episodes_path(tmp_path))([episode(True), episode(False, True)], step=1)
    EpisodeLog(episodes_path(tmp_path, rank=1))([episode(False, False)], step=1)
    EpisodeLog(episodes_path(tmp_path))([episode(True), episode(True)], step=2)  # no second program: no point
    EpisodeLog(episodes_path(tmp_path))([episode(False, True), episode(False, False)], step=3)
    assert lift_curve(tmp_path) == [(1, 0.0), (3, 0.5)]


def test_the_swap_figures_judge_a_repairer_against_its_own_fresh_samples():
    from bench.repair_swap import fresh_counts, lift_over

    fb = Feedback(("error",), "It failed")
    right, wrong = {"correctness": 1.0}, {"correctness": 0.0}

    def episode(q: str, first: bool, second: bool | None = None) -> Episode:
        if second is None:
            return Episode(q, (Turn("p", "ok", components=right if first else wrong),))
        return Episode(
            q, (Turn("p", "ok", components=wrong, feedback=fb), Turn("p", "ok", components=right if second else wrong))
        )

    # the stronger policy X's first programs on q1: right 3 of 6 (its pairs XX and XY); the repairer Y's: 1 of 4
    played = {
        "XX": [episode("q1", True), episode("q1", True), episode("q1", True), episode("q1", False, True)],
        "YY": [
            episode("q1", True),
            episode("q1", False, False),
            episode("q1", False, False),
            episode("q1", False, False),
        ],
        "XY": [episode("q1", False, True), episode("q1", False, False)],
    }
    counts = fresh_counts(played)
    assert counts["X"] == {"q1": (3, 6)} and counts["Y"] == {"q1": (1, 4)}
    # Y fixes X's wrong program half the time: 0.25 above its own fresh rate, no better than X resampling
    assert lift_over("XY", played["XY"], counts) == pytest.approx(0.5 - 0.25)
    assert lift_over("XX", played["XY"], counts) == pytest.approx(0.5 - 3 / 5)  # X's own wrong sample left out
    assert lift_over("XZ", played["XY"], counts) is None  # Z wrote no first program here
    assert lift_over("XX", played["XX"][:3], counts) is None  # no wrong first program went on
    # apart by what the wrong first program did: all of XY's ran (and failed their tests)
    assert lift_over("XY", played["XY"], counts, ran=True) == pytest.approx(0.25)
    assert lift_over("XY", played["XY"], counts, ran=False) is None
    crashed = Episode(
        "q1", (Turn("p", "runtime_error", components=wrong, feedback=fb), Turn("p", "ok", components=right))
    )
    assert lift_over("XY", [*played["XY"], crashed], counts, ran=False) == pytest.approx(1 - 0.25)
    assert lift_over("XY", [*played["XY"], crashed], counts, ran=True) == pytest.approx(0.25)


def test_repair_kept_best_answers_from_the_turn_its_unit_tests_score_highest(tmp_path):
    """The report's `repair_best` row: the repair mode's own episodes, the answer taken from the turn the
    unit tests score highest (the earliest of equals; a turn that failed to run never), not the last."""
    from bench.repair_report import UNSEEN, best_turn_scores
    from vprl.data.records import Example

    def turn(status: str, answer: str | None, tests: float | None) -> dict:
        return Turn("p", status, answer=answer, components={"unit_tests": tests}).to_json()

    episodes = {
        "a": [turn("ok", "red", 0.6), turn("ok", "blue", 0.4)],  # the last is wrong, the better-tested right
        "b": [turn("runtime_error", None, None), turn("ok", "red", 0.2)],  # only the second ran
        "c": [turn("ok", "blue", 0.6), turn("ok", "red", 0.6)],  # equal scores: the first, wrong
        "d": [turn("ok", "red", 1.0)],  # passed at once: one turn
    }
    rows = [
        {"policy": "after_rl", "mode": "2-turn repair", "dataset": UNSEEN, "seed": 0, "example_id": q, "turns": t}
        for q, t in episodes.items()
    ]
    rows.append({**rows[0], "policy": "before_rl", "turns": [turn("ok", "blue", 1.0)]})  # another policy
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples = [Example(q, "shapes", "vqa", "What color?", "i.png", answers=("red",)) for q in episodes]
    scores = best_turn_scores(str(predictions), examples, "after_rl", "2-turn repair")
    # the same episodes: the same executions as the repair mode's
    from bench.repair_report import _executions

    assert _executions(str(predictions), {"repair": "2-turn repair"})["after_rl"] == {
        "repair": 1.0,
        "repair_best": 1.0,
    }
    assert scores == {"a": 1.0, "b": 1.0, "c": 0.0, "d": 1.0}
    with pytest.raises(ValueError, match="no after_rl/2-turn repair prediction for 1 example"):
        best_turn_scores(
            str(predictions),
            [*examples, Example("e", "shapes", "vqa", "?", "i.png", ("red",))],
            "after_rl",
            "2-turn repair",
        )


def test_paired_calls_compare_one_arm_across_two_calls_on_the_same_bootstraps(tmp_path, monkeypatch):
    """bench/repair_paired.py: the treated call's arm against the control's, question by question;
    refused where the policies before RL differ (not the same bootstraps) or a seed is missing."""
    import bench.repair_paired as rp
    from vprl.train.evaluation.gains import paired_gain

    questions = [f"q{i}" for i in range(6)]
    after = {"treated": [1, 1, 1, 0, 1, 0], "control": [1, 0, 0, 0, 1, 0]}

    def scores(record, world, mode, policy):
        if policy == "before_rl":
            return dict.fromkeys(questions, float(record.get("before", 0.5)))
        return {q: float(v) for q, v in zip(questions, after[record["side"]], strict=True)}

    monkeypatch.setattr(rp, "unseen_scores", scores)
    monkeypatch.setattr(rp, "lift_curve", lambda run_dir: [])

    def call(side: str, seeds: tuple[int, ...], **more) -> str:
        folders = []
        for seed in seeds:
            folder = tmp_path / f"{side}_{seed}"
            folder.mkdir(exist_ok=True)
            rows = [
                {"seed": seed, "arm": "single", "side": side, "repair_curve": [], "run_dir": "x"},
                {"seed": seed, "arm": "repair", "side": side, "repair_curve": [(1, 0.5)], "run_dir": "x", **more},
            ]
            (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            folders.append(str(folder))
        return ",".join(folders)

    summary = rp.main([call("treated", (0, 1)), call("control", (0, 1))])
    want = paired_gain(
        [scores({"side": "control"}, None, "", "after_rl")] * 2, [scores({"side": "treated"}, None, "", "")] * 2
    )
    assert summary["treated − control"]["repair"] == want.to_json()
    assert want.mean == pytest.approx(2 / 6)
    assert summary["repair_rate"]["treated"]["per_seed"][0]["first"] == 0.5
    with pytest.raises(SystemExit, match="before RL differ in single: not the same bootstraps"):
        rp.main([call("treated", (0, 1)), call("control", (0, 1), before=0.25)])
    with pytest.raises(SystemExit, match=r"seeds \[0, 1\], the control \[0\]"):
        rp.main([call("treated", (0, 1)), call("control", (0,))])
    twice = call("treated", (0,))
    with pytest.raises(SystemExit, match=r"treated_0/runs.jsonl:2: a second repair record of seed 0"):
        rp.main([f"{twice},{twice}", call("control", (0,))])


def test_the_outcomes_of_wrong_first_programs_sent_back(tmp_path):
    from bench.repair_outcomes import names_an_object_off_question, run_figures

    fb = Feedback(("error",), "It failed")
    right, wrong = {"correctness": 1.0}, {"correctness": 0.0}
    star = 'def execute_command(image):\n    return image_patch.find("red star")[0].simple_query("c")\n'
    stars = star.replace('"red star"', "'stars'")
    square = star.replace("star", "square")
    circle = star.replace("star", "circle")

    def episode(first: str, later: tuple | None, qid: str = "q1", shared: bool = False) -> Episode:
        head = Turn(first, "ok", answer="blue", components=wrong, feedback=fb if later else None)
        if later is None:
            return Episode(qid, (head,), shared)
        program, status, answer, score = later
        return Episode(qid, (head, Turn(program, status, answer=answer, components=score)), shared)

    questions = {"q1": "What color are the stars?"}
    step1 = [
        episode(square, (star, "ok", "red", right)),  # repaired, on the question
        episode(square, (circle, "runtime_error", None, wrong)),  # fails to run, names a circle
        episode(square, (square + "\n# again", "ok", "blue", wrong)),  # the first program again
        episode(star, (stars, "ok", "blue", wrong)),  # another program, the same answer
        episode(star, (circle, "ok", "green", wrong)),  # another wrong answer
        episode(star, None),  # a wrong first program that passed its unit tests: not sent back
        episode(square, (star, "ok", "red", right), shared=True),  # a copied first program: counted once
        Episode("q1", (Turn(star, "ok", components=right),)),  # right first: not counted
        episode(square, (star, "ok", "red", right), qid="q2"),  # a question not known: out of the split
    ]
    EpisodeLog(episodes_path(tmp_path))(step1, step=1)
    EpisodeLog(episodes_path(tmp_path))([episode(star, (circle, "ok", "red", right))], step=2)
    figures = run_figures(tmp_path, questions, window=1)
    first = figures["first"]
    assert first["steps"] == [1, 1] and first["wrong_first"] == 7 and first["sent_back"] == pytest.approx(6 / 7)
    assert first["outcomes"] == {
        "repaired": pytest.approx(2 / 6),
        "fails_to_run": pytest.approx(1 / 6),
        "repeats_first": pytest.approx(1 / 6),
        "same_answer": pytest.approx(1 / 6),
        "other_wrong": pytest.approx(1 / 6),
    }
    # of the 5 known questions' later programs, the circles and the square again are off the question
    assert first["later_names_off_question"] == pytest.approx(3 / 5)
    assert first["first_names_off_question"] == pytest.approx(3 / 5)
    assert first["repaired_when_off"] == 0 and first["repaired_when_on"] == pytest.approx(1 / 2)
    last = figures["last"]
    assert last["steps"] == [2, 2] and last["outcomes"]["repaired"] == 1 and last["repaired_when_off"] == 1
    assert not names_an_object_off_question('image_patch.exists("large stars")', "Is there a star?")
    assert names_an_object_off_question('image_patch.exists("hexagon")', "Is there a star?")
