"""The evaluation report as a reader meets it: the fallback rows with the share the fallback answered
and why they can fall, Winoground's three equal scores said, a glossary of modes, numbers and rates,
the tables as CSV and LaTeX, and question types too small to mean anything pooled.

The metrics come from `dataset_metrics` on the loaders' fixtures with hand-written predictions, so
every number below is known.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from vprl.data.loaders import load_dataset
from vprl.data.records import Example
from vprl.train.evaluation.metrics import Prediction, dataset_metrics
from vprl.train.evaluation.report import markdown, write_reports

# What this issue added is imported in the tests that need it, so that each test fails on its own
# against the code before it (rather than the whole file failing to import).

FIX = Path(__file__).parent / "fixtures" / "datasets"


def _winoground_results():
    """before_rl: every program crashes and the fallback answers all right; after_rl: every program
    runs, right on Winoground id 0 and "yes" to everything else, so the fallback answers nothing."""
    examples = load_dataset("winoground", FIX / "winoground")
    before = [Prediction(e.id, None, "runtime_error", fallback_answer=e.answers[0]) for e in examples]
    after = [Prediction(e.id, e.answers[0] if e.meta["winoground_id"] == "0" else "yes", "ok") for e in examples]
    results = {}
    for policy, preds in (("before_rl", before), ("after_rl", after)):
        results[policy] = {
            "single": {"winoground": {0: dataset_metrics(examples, preds)}},
            "single+fallback": {"winoground": {0: dataset_metrics(examples, preds, use_fallback=True)}},
        }
    return results


def test_fallback_rows_carry_the_fallback_share_and_say_why_they_fall():
    from vprl.train.evaluation.report import FALLBACK_EXPLAINED

    results = _winoground_results()
    assert results["after_rl"]["single+fallback"]["winoground"][0].headline["group"] < 0.5  # the fall
    text = markdown(results)
    section = text.split("## single+fallback")[1].split("## Details")[0]
    assert "Share of the questions the fallback answered (%):" in section
    assert "| before_rl | 100.0 |" in section and "| after_rl | 0.0 |" in section
    assert FALLBACK_EXPLAINED in section
    assert (
        "- winoground: before_rl → after_rl 100.0 → 33.3 with the fallback, which answers 100.0 → 0.0 % of the "
        "questions; the programs alone 0.0 → 33.3" in section
    )
    # the program-alone table has no such lines: nothing fell back there
    assert "fallback answered" not in text.split("## single+fallback")[0]
    # a cell that rises (the same two policies the other way round) gets the share but no line
    flipped = markdown({"after_rl": results["after_rl"], "before_rl": results["before_rl"]})
    assert "Share of the questions the fallback answered" in flipped and "Where this happens" not in flipped


def test_winoground_scores_are_said_to_be_equal_and_the_glossary_explains_every_row_and_rate():
    from vprl.train.evaluation.conventions import NOTES, RATES

    results = _winoground_results()
    m = results["after_rl"]["single"]["winoground"][0]
    assert m.headline["text"] == m.headline["image"] == m.headline["group"]
    modes = {"single": "one greedy program per question", "single+fallback": "the same, with the tool"}
    text = markdown(results, modes)
    before_details = text.split("## Details")[0]
    assert f"winoground: {NOTES['winoground']}." in before_details
    glossary = text.split("## Glossary")[1]
    assert "- **single**: one greedy program per question" in glossary
    assert "- **single+fallback**: the same, with the tool" in glossary
    for rate in m.rates:
        assert f"- `{rate}`: {RATES[rate]}" in glossary
    assert "  - `group`: official (Winoground)" in glossary
    # without descriptions (a report read back from JSON) every row still gets a line
    generic = markdown(results).split("## Glossary")[1]
    assert "- **single+fallback**: the programs of 'single', with the end-to-end tool's answer" in generic


def test_tables_as_csv_and_latex(tmp_path):
    from vprl.train.evaluation.tables import latex, tex

    results = _winoground_results()
    paths = write_reports(results, tmp_path, modes={"single": "one greedy program"})
    with open(paths["csv"], encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [(r["policy"], r["mode"]) for r in rows] == [
        ("before_rl", "single"),
        ("before_rl", "single+fallback"),
        ("after_rl", "single"),
        ("after_rl", "single+fallback"),
    ]
    assert rows[1]["metric"] == "group" and rows[1]["official"] == "True"
    assert float(rows[1]["mean_pct"]) == 100.0 and float(rows[1]["fallback_pct"]) == 100.0
    assert rows[2]["questions"] == "12" and float(rows[2]["mean_pct"]) == pytest.approx(100 / 3, abs=1e-3)
    with open(paths["per_type_csv"], encoding="utf-8") as f:
        types = list(csv.DictReader(f))
    assert {(r["type"], r["questions"]) for r in types} == {("Noun", "2"), ("Adjective-Size", "1")}
    tex_text = paths["latex"].read_text()
    assert tex_text == latex(results)
    assert tex_text.count("\\begin{tabular}{lr}") == 2 and "\\caption{Mode single+fallback:" in tex_text
    assert "before\\_rl & 100.0 \\\\" in tex_text and "after\\_rl & 33.3 \\\\" in tex_text
    assert tex("a_b & 50% #1 {x} ~^\\") == "a\\_b \\& 50\\% \\#1 \\{x\\} \\textasciitilde{}\\^{}\\textbackslash{}"
    assert '"single": "one greedy program"' in paths["json"].read_text()


def _small_types():
    """A VQA set with one type of 20 questions and two of 1 and 4: the program is right on the
    first 15 of the big type, on the one-question type and on none of the four."""
    groups = ["big"] * 20 + ["one"] + ["four"] * 4
    examples = [
        Example(f"q{i}", "toyvqa", "vqa", f"question {i}?", "x.png", answers=("a",), group=g)
        for i, g in enumerate(groups)
    ]
    right = set(range(15)) | {20}
    preds = [Prediction(e.id, "a" if i in right else "b", "ok") for i, e in enumerate(examples)]
    return {"p": {"single": {"toyvqa": {0: dataset_metrics(examples, preds)}}}}


def test_types_with_few_questions_are_pooled_in_the_plots(monkeypatch, tmp_path):
    from vprl.train.evaluation import plots
    from vprl.train.evaluation.tables import pooled_groups

    results = _small_types()
    per_group = results["p"]["single"]["toyvqa"][0].per_group
    assert pooled_groups(per_group, "accuracy") == [
        ("big", 0.75, 20),
        ("2 other types, under 10 questions each", 0.2, 5),
    ]
    shown = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: shown.append(fig) or path)
    plots.plot_per_type(results, "toyvqa", tmp_path / "x.png")
    labels = [t.get_text() for t in shown[0].axes[0].get_yticklabels()]
    assert labels == ["big (n=20)", "2 other types, under 10 questions each (n=5)"]
    shown[0].clf()


def test_prediction_rows_say_what_was_asked_and_whether_it_was_right():
    from vprl.train.evaluation.pipeline import prediction_row

    key = {"policy": "p", "mode": "single", "dataset": "d", "seed": 0}
    ref = Example("r1", "refcoco", "grounding", "the red ball", "x.png", box=(0, 0, 10, 10))
    crashed = Prediction("r1", None, "runtime_error", fallback_answer={"box": [0, 0, 10, 10]})
    row = prediction_row(key, ref, crashed, fallback=True)
    assert row["query"] == "the red ball" and row["gold"] == [0.0, 0.0, 10.0, 10.0]
    assert (row["score"], row["correct"], row["score_with_fallback"], row["correct_with_fallback"]) == (
        0.0,
        False,
        1.0,
        True,
    )
    from vprl.train.evaluation.conventions import PREDICTION_FIELDS

    assert set(PREDICTION_FIELDS) <= set(row)  # the glossary describes every field a row adds
    assert "- `correct_with_fallback`: " in markdown(_winoground_results()).split("### predictions.jsonl")[1]
    question = Example("q1", "gqa", "vqa", "What color is the ball?", "x.png", answers=("red",))
    row = prediction_row(key, question, Prediction("q1", "Red", "ok"), fallback=False)
    assert row["gold"] == ["red"] and row["correct"] is True and "correct_with_fallback" not in row
    assert row["policy"] == "p" and row["answer"] == "Red" and row["status"] == "ok"
