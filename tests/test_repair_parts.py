"""The parts of repair episodes (#35) without a policy: the conversation's text, the episode record
and its figures, the episode loop and the recipe's repair keys (the feedback message:
test_repair_feedback.py; the episode log: test_repair_log.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_repair_feedback import _result

from vprl.data.records import Example
from vprl.rewards.feedback import Feedback, FeedbackConfig
from vprl.train.prompts.conversation import (
    HEADER,
    INSTRUCTION,
    conversation_text,
    episode_programs,
    feedback_comment,
    final_program,
    opener_of,
)
from vprl.train.recipe.parsing import ConfigError
from vprl.train.recipe.rl_config import parse_rl_config
from vprl.train.repair.episode import Episode, Turn, episode_stats, resample_lift
from vprl.train.repair.turns import EpisodeLoop, RepairConfig, episode_reward, repeats

REPO = Path(__file__).resolve().parents[1]
SIGNATURE = "def execute_command(image) -> str:"


def test_the_block_ends_with_the_prompts_last_block_the_query_and_the_signature():
    bare = "# Is there a red circle?\n" + SIGNATURE
    assert opener_of(bare) == bare
    viunit = (
        "import math\n\nclass ImagePatch:\n    pass\n\n# Context: a kitchen\n# Query: Is it red?\nProgram:\n"
        + SIGNATURE
    )
    assert opener_of(viunit) == "# Context: a kitchen\n# Query: Is it red?\nProgram:\n" + SIGNATURE
    chat = "<start_of_turn>user\n# Is it red?<end_of_turn>\n<start_of_turn>model\n" + SIGNATURE
    assert opener_of(chat) == SIGNATURE  # turn markers are the template's: the signature alone
    fb = Feedback(("error",), "It raised an exception: ZeroDivisionError (line 2)")
    text = conversation_text(bare, ["\n    return 1 / 0\n"], [fb])
    assert text.endswith(INSTRUCTION + "\n" + bare) and text.count(SIGNATURE) == 2


def test_the_final_program_is_read_back_from_an_episode_text():
    prompt = "# Is there a red circle?\n" + SIGNATURE
    first = "\n    return 1 / 0\n"
    fb = Feedback(("error",), "It raised an exception: ZeroDivisionError (line 2)")
    second = "\n    return 'yes'\n"
    text = first + "\n" + feedback_comment(fb) + "\n" + SIGNATURE + second
    assert text.count("\n" + HEADER) == 1
    assert [p.strip() for p in episode_programs(prompt, text)] == [
        f"{SIGNATURE}\n    return 1 / 0",
        f"{SIGNATURE}\n    return 'yes'",
    ]
    assert final_program(prompt, text).strip() == f"{SIGNATURE}\n    return 'yes'"
    assert final_program(prompt, first).strip() == f"{SIGNATURE}\n    return 1 / 0"  # one turn: the program itself


def _turn(right: bool | None, status: str = "ok", feedback: Feedback | None = None) -> Turn:
    components = {} if right is None else {"correctness": 1.0 if right else 0.0}
    return Turn("p", status, total=1.0 if right else 0.0, components=components, passed=bool(right), feedback=feedback)


def test_episodes_round_trip_and_their_figures():
    fb = Feedback(("error", "trace"), "It failed")
    episodes = [
        Episode("a", (_turn(False, "runtime_error", fb), _turn(True))),  # repaired
        Episode("b", (_turn(False, "ok", fb), _turn(False))),  # not repaired
        Episode("c", (_turn(True),)),  # right at once
        Episode("d", (_turn(True, "ok", fb), _turn(False))),  # broken
    ]
    for e in episodes:
        assert Episode.from_json(json.loads(json.dumps(e.to_json()))) == e
    stats = episode_stats(episodes)
    assert stats["repair/repair_rate"] == 0.5 and stats["repair/break_rate"] == 0.5
    assert stats["repair/turns_mean"] == 7 / 4 and stats["repair/feedback_error"] == 1.0
    with pytest.raises(ValueError, match=r"episode\.turns\[0\]: status"):
        Episode.from_json({"example_id": "a", "turns": [{"program": "p", "status": 3}]})


def test_resample_lift_compares_a_second_program_with_fresh_first_programs_of_its_question():
    fb = Feedback(("error",), "It failed")

    def episode(example: str, first: bool, second: bool | None = None) -> Episode:
        if second is None:
            return Episode(example, (_turn(first),))
        return Episode(example, (_turn(first, "ok", fb), _turn(second)))

    episodes = [
        # "a": of the others, 2 of 3 first programs right: the fix is +1/3 and the miss -2/3
        *(episode("a", True), episode("a", True), episode("a", False, True), episode("a", False, False)),
        episode("b", False, True),  # no other program of its question to compare with: left out
        *(episode("c", False, True), episode("c", False, True)),  # no fresh program right: +1 each
        episode("d", True, False),  # a right first program sent back is the break rate's, not this
    ]
    assert resample_lift(episodes) == pytest.approx((1 / 3 - 2 / 3 + 1 + 1) / 4)
    assert episode_stats(episodes)["repair/resample_lift"] == resample_lift(episodes)
    # repair_branches: a copied first program is its sample's, counted once and left out with it
    shared = Episode("e", (_turn(False, "ok", fb), _turn(False)), shared_first=True)
    branched = [episode("e", False, True), shared, episode("e", True)]  # samples: wrong, right
    assert resample_lift(branched) == pytest.approx(((1 - 1) + (0 - 1)) / 2)
    assert Episode.from_json(json.loads(json.dumps(shared.to_json()))) == shared
    assert "shared_first" not in branched[0].to_json()  # the logs of unbranched runs are as before
    with pytest.raises(ValueError, match="shares the first program of no earlier episode"):
        resample_lift([shared])
    with pytest.raises(ValueError, match="shared_first: expected true or false"):
        Episode.from_json({**shared.to_json(), "shared_first": "yes"})
    assert resample_lift([episode("a", True), episode("a", True)]) is None
    assert "repair/resample_lift" not in episode_stats([episode("b", False, True)])


def test_a_repeated_program_costs_its_episode_the_repeat_cost():
    fb = Feedback(("error",), "It failed")
    first = "def execute_command(image):\n    return 'red'"
    same = "def execute_command(image):\n    # once more\n    return  'red'\n"  # another layout, one AST
    other = "def execute_command(image):\n    return 'blue'"

    def episode(*programs: str) -> Episode:
        turns = [Turn(p, "ok", total=0.25, feedback=fb) for p in programs[:-1]]
        return Episode("a", (*turns, Turn(programs[-1], "ok", total=0.25)))

    config = RepairConfig(max_turns=3, turn_cost=0.1, repeat_cost=0.5)
    cases = [(first,), (first, same), (first, other), (first, other, same)]
    assert [repeats(episode(*programs)) for programs in cases] == [0, 1, 0, 1]
    assert episode_reward(episode(first), config) == 0.25
    assert episode_reward(episode(first, same), config) == pytest.approx(0.25 - 0.1 - 0.5)
    assert episode_reward(episode(first, other), config) == pytest.approx(0.25 - 0.1)
    assert episode_reward(episode(first, same), RepairConfig(max_turns=2)) == 0.25  # no cost by default
    with pytest.raises(ConfigError, match="repair_repeat_cost: must be >= 0, got -1"):
        _cfg("--repair_max_turns", "2", "--repair_repeat_cost", "-1")
    with pytest.raises(ValueError, match="repair_repeat_cost must be >= 0"):
        RepairConfig(repeat_cost=-0.5)


class _Scorer:
    """Scores a program by its text: 'ok' runs and is right, 'wrong' runs and is wrong, else it fails."""

    def __init__(self):
        self.batches = []

    def score(self, examples, programs):
        from vprl.rewards.compose import RewardBatch
        from vprl.train.rollouts.scorer import ScoredBatch

        self.batches.append(list(programs))
        results = [
            _result("ok" if p in ("ok", "wrong") else "runtime_error", answer=p, error="E (line 2)") for p in programs
        ]
        correct = [1.0 if p == "ok" else 0.0 if p == "wrong" else None for p in programs]
        totals = [c if c is not None else -0.5 for c in correct]
        return ScoredBatch(results, RewardBatch(totals, {"correctness": correct}, [r.status for r in results]))


def test_the_loop_stops_each_row_at_its_stop_rule_and_at_max_turns():
    examples = [Example(f"e{i}", "shapes", "vqa", "q?", "img.png", answers=("x",)) for i in range(3)]
    scorer = _Scorer()
    config = RepairConfig(3, 0.1, FeedbackConfig(stop_when="passed", check="correctness"))
    asked = []

    def next_programs(rows, feedbacks):
        asked.append(rows)
        assert all(isinstance(fb, Feedback) for fb in feedbacks)
        return ["wrong"] * len(rows)

    episodes = EpisodeLoop(scorer, config).run(examples, ["ok", "boom", "wrong"], next_programs)
    assert [len(e.turns) for e in episodes] == [1, 3, 3]
    assert asked == [[1, 2], [1, 2]]
    assert episodes[0].final.feedback is None and all(t.feedback for t in episodes[1].turns[:-1])
    assert episodes[1].final.feedback is None  # the last turn is never shown anything


def test_a_row_that_cannot_go_on_ends_without_unshown_feedback():
    examples = [Example("e0", "shapes", "vqa", "q?", "img.png", answers=("x",))]
    episodes = EpisodeLoop(_Scorer(), RepairConfig(2)).run(examples, ["boom"], lambda rows, fbs: [None])
    assert len(episodes[0].turns) == 1 and episodes[0].final.feedback is None


def _cfg(*extra: str):
    return parse_rl_config(["--config", str(REPO / "configs/quickstart.yaml"), "--output_dir", "/tmp/x", *extra])


def test_the_recipe_refuses_bad_repair_keys_naming_them():
    from vprl.train.recipe.checks import check_repair

    with pytest.raises(ConfigError, match="repair_max_turns must be at least 1"):
        check_repair(_cfg("--repair_max_turns", "0"), ["correctness"])
    with pytest.raises(ConfigError, match="repair_stop_when 'passed' needs repair_check"):
        check_repair(_cfg("--repair_max_turns", "2", "--repair_stop_when", "passed"), ["correctness"])
    with pytest.raises(ConfigError, match="repair_check: 'unit_tests' is not one of the run's rewards"):
        check_repair(_cfg("--repair_max_turns", "2", "--repair_check", "unit_tests"), ["correctness"])
    with pytest.raises(ConfigError, match="repair_feedback 'verdict' needs a labelled check"):
        check_repair(
            _cfg("--repair_max_turns", "2", "--repair_check", "unit_tests", "--repair_feedback", "verdict"),
            ["unit_tests"],
        )
    check_repair(_cfg("--repair_max_turns", "2", "--algorithm", "rloo"), ["correctness"])
    check_repair(_cfg("--repair_max_turns", "2", "--repair_feedback", "error,trace"), ["correctness"])
    unasked = _cfg("--repair_max_turns", "2", "--repair_check", "unit_tests", "--repair_feedback", "trace,unasked")
    check_repair(unasked, ["unit_tests"])  # read from the question, so a label-free run may show it
    with pytest.raises(ConfigError, match="repair_feedback.*'unasked_words'"):
        check_repair(_cfg("--repair_max_turns", "2", "--repair_feedback", "unasked_words"), ["correctness"])


def test_the_memory_plan_holds_whole_episodes():
    import yaml

    from vprl.executor.tools.stack import stack_path
    from vprl.train.recipe import layout
    from vprl.train.recipe.checks import reward_config
    from vprl.train.recipe.prompt_length import PromptLength

    def policy_gib(name: str) -> float:
        cfg = parse_rl_config(["--config", str(REPO / "configs" / name)])
        return layout.policy_component(cfg, PromptLength(3000, "given")).gib

    one, repair = (
        policy_gib("grpo_codellama_gqa_correctness.yaml"),
        policy_gib("grpo_codellama_gqa_repair_correctness.yaml"),
    )
    assert repair > one * 1.1
    cfg = parse_rl_config(["--config", str(REPO / "configs/grpo_codellama_gqa_repair_correctness.yaml")])
    stack = yaml.safe_load(stack_path(cfg.executor.tool_stack).read_text())
    plan = layout.plan_layout(cfg, stack, reward_config(cfg), ["Is there a red car?"], [80.0], [])
    plan.check()  # the labelled repair recipe fits one 80 GB GPU


def test_rest_trains_a_repaired_episode_s_final_program_after_its_conversation():
    """ReST over episodes: the kept row is the final program, and its SFT example is that program's
    body after the conversation (prompt, the first program, its feedback, the signature): the wrong
    first program is context, never a target."""
    from vprl.train.policy.tiny import train_tokenizer
    from vprl.train.recipe.sections import RestArgs
    from vprl.train.rest.select import select_iteration
    from vprl.train.rollouts.log import RolloutRow

    prompt = "# Is there a red circle?\n" + SIGNATURE
    fb = Feedback(("error",), "It raised an exception: ZeroDivisionError (line 2)")
    context = prompt + "\n    return 1 / 0\n" + feedback_comment(fb) + "\n" + prompt  # the opener again
    final = f"{SIGNATURE}\n    return 'yes'"
    tok = train_tokenizer([context + "\n    return 'yes'\n"] * 4, vocab_size=300, context=256)
    rows = [
        RolloutRow(0, "e1", "h", final, "ok", answer="yes", total=1.0, program_key="a"),
        RolloutRow(0, "e1", "h", f"{SIGNATURE}\n    return 'no'", "ok", answer="no", total=0.0, program_key="b"),
    ]
    out = select_iteration(
        0,
        tokenizer=tok,
        items=[(Example("e1", "shapes", "vqa", "q?", "img.png", answers=("yes",)), prompt)],
        rows=rows,
        flat_items=[0, 0],
        rest=RestArgs(),
        n=2,
        style="plain",
        max_length=None,
        contexts=[context, None],
    )
    (kept,) = out["kept"]
    assert kept.program == final and kept.context == context
    (ex,) = out["sft_rows"]
    trained = [t for t, m in zip(ex["input_ids"], ex["completion_mask"], strict=True) if m]
    assert tok.decode(trained, skip_special_tokens=True).strip() == "return 'yes'"
    assert tok.decode(ex["input_ids"], skip_special_tokens=True).count(HEADER) == 1


def test_a_remembering_scorer_runs_a_final_program_once():
    """A repair run scores an episode's final program in the loop and again through trl's reward
    functions: the second score is the first, served without running the program again, in the
    caller's order among programs it has not seen."""
    from vprl.rewards.compose import RewardComposer, RewardConfig, RewardSpec
    from vprl.train.rollouts.scorer import ProgramScorer

    class Runner:
        def __init__(self):
            self.ran: list[str] = []

        def run(self, pairs, progress=False):
            self.ran += [p for _, p in pairs]
            return [_result("ok" if "yes" in p else "runtime_error", answer="yes", error="E") for _, p in pairs]

    runner = Runner()
    composer = RewardComposer(RewardConfig((RewardSpec("correctness"),)))
    scorer = ProgramScorer(runner, composer, remember=8)
    examples = [Example(f"e{i}", "shapes", "vqa", "q?", "img.png", answers=("yes",)) for i in range(3)]
    first = scorer.score(examples[:2], ["return 'yes'", "boom"])
    again = scorer.score([examples[2], examples[1], examples[0]], ["return 'yes'", "boom", "return 'yes'"])
    assert runner.ran == ["return 'yes'", "boom", "return 'yes'"]  # only e2's program is new
    assert again.rewards.totals == [1.0, first.rewards.totals[1], 1.0]
    assert again.rewards.components == {"correctness": [1.0, None, 1.0]}
    assert [r.status for r in again.results] == ["ok", "runtime_error", "ok"]
    plain = ProgramScorer(runner, composer)  # remembers nothing: runs every time
    plain.score(examples[:1], ["return 'yes'"])
    assert runner.ran[-1] == "return 'yes'" and len(runner.ran) == 4
