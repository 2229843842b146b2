"""The feedback message of a repair turn (#35): what each part shows, when a turn gets none, the
budget it is cut to, and that no reference answer reaches it (a planted sentinel)."""

from __future__ import annotations

import json

import pytest

from vprl.data.records import Example
from vprl.executor.results import ExecutionResult, ToolCallRecord
from vprl.rewards.feedback import MAX_FEEDBACK_CHARS, Feedback, FeedbackConfig, turn_feedback
from vprl.train.prompts.conversation import FEEDBACK_TOKENS, episode_tokens
from vprl.train.repair.turns import EpisodeLoop, RepairConfig

SENTINEL = "zq-sentinel-answer-4410"
SIGNATURE = "def execute_command(image) -> str:"
CALL = ToolCallRecord("find", {"name": "red circle"}, None, '[{"box": [1, 2, 3, 4]}]', line=2)


def _result(status: str, answer=None, error=None, calls=(CALL,)) -> ExecutionResult:
    return ExecutionResult("e1", "k", status, answer=answer, error=error, tool_calls=tuple(calls))


def test_a_failed_program_is_shown_its_error_with_its_line_and_its_calls():
    error = "ZeroDivisionError: division by zero (line 3: return 1 / 0)"
    fb = turn_feedback(FeedbackConfig(), _result("runtime_error", error=error), {})
    assert fb.parts == ("error", "trace")
    assert "It raised an exception: " + error in fb.text
    assert 'line 2: find("red circle") -> [{"box": [1, 2, 3, 4]}]' in fb.text


def test_a_program_that_ran_gets_no_feedback_under_the_stop_rule_ran():
    assert turn_feedback(FeedbackConfig(), _result("ok", answer="no"), {"correctness": 0.0}) is None


def test_our_own_failure_gets_no_feedback():
    assert turn_feedback(FeedbackConfig(stop_when="passed", check="correctness"), _result("infra_error"), {}) is None


def test_failed_unit_tests_come_in_the_re_prompt_structure():
    tests = [
        {"caption": "a red circle", "expected": "yes", "status": "ok", "answer": "no", "score": 0.0},
        {"caption": "a blue square", "expected": "no", "status": "ok", "answer": "no", "score": 1.0},
        {"caption": "two circles", "expected": "yes", "status": "runtime_error", "answer": None, "score": 0.0},
    ]
    config = FeedbackConfig(stop_when="passed", check="unit_tests", pass_threshold=1.0)
    fb = turn_feedback(config, _result("ok", answer="no"), {"unit_tests": 1 / 3}, tests)
    assert fb.parts == ("trace", "unit_tests")
    assert 'image content: "a red circle"; expected answer: "yes"; program output: "no"' in fb.text
    assert 'image content: "two circles"; expected answer: "yes"; program output: "runtime error"' in fb.text
    assert "a blue square" not in fb.text  # a passed test is not shown


def test_the_verdict_says_wrong_without_the_right_answer():
    config = FeedbackConfig(stop_when="passed", check="correctness", show=("error", "trace", "verdict"))
    fb = turn_feedback(config, _result("ok", answer="blue"), {"correctness": 0.0})
    assert fb.parts == ("trace", "verdict") and 'Its answer "blue" is wrong.' in fb.text


def test_a_label_free_run_refuses_the_verdict():
    with pytest.raises(ValueError, match="verdict"):
        FeedbackConfig(stop_when="passed", check="unit_tests", show=("verdict",))


def test_the_gold_answer_never_appears_in_feedback():
    """Episodes through the loop, a scorer and the real correctness reward, which reads the
    examples' reference answers: a planted answer no program produced reaches neither a feedback
    message (every status, every part, the verdict included) nor an episode's record."""
    from vprl.rewards.compose import RewardComposer, RewardConfig, RewardSpec
    from vprl.train.rollouts.scorer import ProgramScorer

    statuses = ["ok", "runtime_error", "syntax_error", "timeout", "bad_return"]

    class Runner:
        def run(self, pairs, progress=False):
            return [_result(p, answer="blue" if p == "ok" else None, error="E: boom (line 2)") for _, p in pairs]

    composer = RewardComposer(RewardConfig((RewardSpec("correctness"),)))
    config = RepairConfig(3, 0.0, FeedbackConfig("passed", "correctness", show=("error", "trace", "verdict")))
    examples = [Example(f"e{i}", "shapes", "vqa", "What color?", "img.png", answers=(SENTINEL,)) for i in range(5)]
    shown: list[Feedback] = []

    def next_programs(rows, feedbacks):
        shown.extend(feedbacks)
        return [statuses[(i + 1) % len(statuses)] for i in rows]

    episodes = EpisodeLoop(ProgramScorer(Runner(), composer), config).run(examples, statuses, next_programs)
    assert {p for fb in shown for p in fb.parts} == {"error", "trace", "verdict"}  # every part was shown
    assert all(SENTINEL not in json.dumps(fb.to_json()) for fb in shown)
    assert all(SENTINEL not in json.dumps(e.to_json()) for e in episodes)


def test_unasked_names_each_search_word_the_question_never_uses_with_its_line():
    from vprl.rewards.feedback import unasked_lines

    program = (
        SIGNATURE + "\n    image_patch = ImagePatch(image)\n"
        '    anchor = image_patch.find("cyan circle")[0]\n'
        '    stars = image_patch.find("stars")\n'
        '    if image_patch.exists("star") and anchor.verify_property("circle", "cyan"):\n'
        '        return stars[0].simple_query("What color is the square?")\n'
        '    return image_patch.find("cyan circle")[0].simple_query("What color is it?")\n'
    )
    assert unasked_lines(program, "What color is the square below the circle?") == [
        'line 3: it looks for "cyan circle"; the question never says "cyan".',
        'line 4: it looks for "stars"; the question never says "stars".',
        'line 5: it looks for "star"; the question never says "star".',
    ]  # the repeated phrase once, the simple_query's words never (not a search), three lines at most
    assert unasked_lines(program, "What color is the square below the cyan circle?")[0].startswith("line 4:")
    assert unasked_lines(program, "Are the stars above the cyan circles?") == []  # plural and singular alike
    assert unasked_lines(SIGNATURE + '\n    return find("star"', "Is there a circle?") == []  # no parse, nothing read


def test_unasked_reaches_the_feedback_through_the_loop_from_the_question_only():
    """Through the episode loop with the real correctness reward: the part names the search word
    the example's query lacks, on a program that raised and on one that ran, and no reference
    answer reaches a message."""
    from vprl.rewards.compose import RewardComposer, RewardConfig, RewardSpec
    from vprl.train.rollouts.scorer import ProgramScorer

    programs = [
        SIGNATURE + '\n    return ImagePatch(image).find("star")[0].simple_query("What color?")\n',
        SIGNATURE + '\n    return ImagePatch(image).find("circle")[0].simple_query("What color?")\n',
    ]

    class Runner:
        def run(self, pairs, progress=False):
            out = []
            for _, program in pairs:
                ok = "circle" in program
                out.append(_result("ok" if ok else "runtime_error", answer="blue" if ok else None, error="E (line 2)"))
            return out

    composer = RewardComposer(RewardConfig((RewardSpec("correctness"),)))
    show = ("error", "trace", "verdict", "unasked")
    config = RepairConfig(2, 0.0, FeedbackConfig("passed", "correctness", show=show))
    examples = [
        Example(f"e{i}", "shapes", "vqa", "What color is the circle?", "img.png", answers=(SENTINEL,))
        for i in range(2)
    ]
    shown: list[Feedback] = []

    def next_programs(rows, feedbacks):
        shown.extend(feedbacks)
        return [programs[1] for _ in rows]

    EpisodeLoop(ProgramScorer(Runner(), composer), config).run(examples, programs, next_programs)
    raised, ran = shown
    assert raised.parts == ("error", "trace", "unasked")
    assert raised.text.endswith('line 2: it looks for "star"; the question never says "star".')
    assert ran.parts == ("trace", "verdict")  # "circle" is the question's word: nothing to name
    assert all(SENTINEL not in json.dumps(fb.to_json()) for fb in shown)


def test_a_long_trace_is_cut_to_the_feedback_budget():
    calls = [ToolCallRecord("find", {"name": "x" * 50}, None, "r" * 190, line=i) for i in range(40)]
    fb = turn_feedback(FeedbackConfig(max_calls=40), _result("runtime_error", error="E", calls=calls), {})
    assert len(fb.text) <= MAX_FEEDBACK_CHARS and fb.text.endswith("...")
    assert episode_tokens(2, 320) == 640 + FEEDBACK_TOKENS
    # a part whose lines the cut removed is not named among the message's parts (the logs count them)
    config = FeedbackConfig(max_calls=40, show=("error", "trace", "unasked"))
    program = SIGNATURE + '\n    return ImagePatch(image).find("star")[0].simple_query("What color?")\n'
    cut = turn_feedback(config, _result("runtime_error", error="E", calls=calls), {}, (), program, "Is it red?")
    assert cut.parts == ("error", "trace") and "never says" not in cut.text
    whole = turn_feedback(config, _result("runtime_error", error="E", calls=calls[:2]), {}, (), program, "Is it red?")
    assert whole.parts == ("error", "trace", "unasked") and whole.text.endswith('never says "star".')
