from collections import Counter

import numpy as np
import pytest

from vprl.executor.results import ExecutionResult
from vprl.rewards.unit_tests.parsing import UnitTest, merge_tests, parse_tests
from vprl.rewards.unit_tests.sampler import coverage, hashing_embedder, random_tests, sample_tests
from vprl.rewards.unit_tests.scoring import ScoringConfig, program_score, unit_test_score

REPLY = """Tests:
1. Image Caption: "A red circle next to a blue square" Answer: red
2. Image Caption: "A green circle alone on a grey background" Answer: Green.
3. Image Caption: "A red circle next to a blue square" Answer: red
4. Image Caption: "A scene with no circles, only two yellow triangles" Answer: no answer 5. Image Caption: "A purple circle" Answer: this answer has far too many words in it
6. Image Caption: A large blue circle above a small red star Answer: blue
"""


def test_parse_dedup_and_long_answers():
    warnings = Counter()
    tests = parse_tests(REPLY, warnings)
    assert [t.answer for t in tests] == ["red", "green", "no answer", "blue"]
    assert tests[3].caption == "A large blue circle above a small red star"
    assert warnings == Counter({"duplicate": 1, "long_answer": 1})


def test_unparseable_reply_yields_no_tests_and_a_warning():
    warnings = Counter()
    assert parse_tests("I cannot help with that.", warnings) == []
    assert warnings["unparseable_reply"] == 1


def test_merge_and_json_round_trip():
    a = [UnitTest("x", "yes"), UnitTest("y", "no")]
    merged = merge_tests([a, [UnitTest("X", "yes"), UnitTest("z", "no")]])
    assert [t.caption for t in merged] == ["x", "y", "z"]
    assert UnitTest.from_json(a[0].to_json()) == a[0] and a[0].key != a[1].key


def test_sampler_covers_answers_first_then_spreads_inputs():
    tests = [
        UnitTest("a red circle on the left", "yes"),
        UnitTest("a red circle on the right", "yes"),
        UnitTest("a red circle in the middle", "yes"),
        UnitTest("two blue squares and a star", "yes"),
        UnitTest("nothing but a green triangle", "no"),
    ]
    picked = sample_tests(tests, k=3)
    assert len(picked) == 3 and {t.answer for t in picked} == {"yes", "no"}
    # After one test per answer, the farthest caption from those chosen is the squares-and-star one.
    assert picked[2].caption == "two blue squares and a star"
    assert sample_tests(tests, k=10) == tests and sample_tests(tests, k=0) == []
    # more answers than k: the answer phase stops at k
    many = [UnitTest(f"caption {i}", str(i)) for i in range(6)]
    assert len(sample_tests(many, k=4)) == 4 and coverage(sample_tests(many, k=4)) == 1.0
    assert len(random_tests(tests, 2, seed=1)) == 2


def test_hashing_embedder_is_normalised_and_deterministic():
    e = hashing_embedder(64)(["a red circle", "a red circle", ""])
    assert np.allclose(np.linalg.norm(e[:2], axis=1), 1.0) and np.allclose(e[0], e[1]) and not e[2].any()


def _r(status, answer=None):
    return ExecutionResult("t", "k", status, answer)


def test_scores_penalties_aggregates_and_modes():
    cfg = ScoringConfig(compile_penalty=1.0, runtime_penalty=0.5)
    assert unit_test_score(_r("ok", "Red."), "red", cfg) == 1.0
    assert unit_test_score(_r("ok", None), "no answer", cfg) == 1.0
    assert unit_test_score(_r("syntax_error"), "red", cfg) == -1.0
    assert unit_test_score(_r("timeout"), "red", cfg) == -0.5
    assert unit_test_score(_r("infra_error"), "red", cfg) is None
    results = [_r("ok", "red"), _r("ok", "blue"), _r("ok", "red"), _r("infra_error")]
    expected = ["red", "red", "red", "red"]
    assert program_score(results, expected, ScoringConfig()) == pytest.approx(2 / 3)
    assert program_score(results, expected, ScoringConfig(aggregate="min")) == 0.0
    assert program_score(results, expected, ScoringConfig(aggregate="majority")) == 1.0
    assert program_score(results, expected, ScoringConfig(mode="all_pass")) == 0.0
    assert program_score(results, expected, ScoringConfig(mode="threshold", threshold=0.6)) == 1.0
    assert program_score([_r("infra_error")], ["x"], ScoringConfig()) is None
    with pytest.raises(ValueError, match="valid"):
        ScoringConfig(aggregate="average")


def test_the_balanced_sampler_keeps_the_expected_answers_even():
    """Seven candidates expect "yes" and three "no": coverage then farthest-first may keep four
    "yes" of five, so always answering "yes" passes 80 %; the balanced sampler keeps 3/2 (3/3 of six)."""
    words = ["red", "blue", "green", "tiny", "huge", "left", "right", "top", "bottom", "middle"]
    pool = [
        UnitTest(f"a {w} circle near a {words[-1 - i]} square", "yes" if i < 7 else "no") for i, w in enumerate(words)
    ]
    for k, most in ((5, 3), (6, 3), (4, 2)):
        chosen = sample_tests(pool, k, balance=True)
        answers = Counter(t.answer for t in chosen)
        assert len(chosen) == k and max(answers.values()) == most, (k, answers)
    assert sample_tests(pool, 5, balance=True)[:2] == sample_tests(pool, 5)[:2]  # answer coverage first, as before
    assert len(sample_tests(pool[:7], 3, balance=True)) == 3  # one answer only: nothing to balance
