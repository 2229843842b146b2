"""The `repair` inference mode (learned repair at evaluation time) on the shapes world, and the chat
framing of a repair conversation.

The policy is `RepairPolicy`, the scripted policy of tests/evaluate_helpers.py taught to read a
repair conversation: it finds the query above the first signature and, once a feedback block is
in the text, writes the gold program (or, with `fix_on_feedback=False`, its first program again).
The modes only ever see programs, so this is what lets the tests check when an episode stops,
what its feedback shows, and that no label reaches a prompt.
"""

from dataclasses import replace

import pytest
from evaluate_helpers import ScriptedPolicy, all_gold, build_world
from test_evaluate_modes import context, score

from vprl.data.shapes.tasks import load_shapes_tasks
from vprl.executor.host import ToolHost
from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.executor.tools.stack import build_backend
from vprl.rewards.feedback import Feedback
from vprl.train.evaluation.config import EvalConfig
from vprl.train.evaluation.judge import build_judge
from vprl.train.evaluation.metrics import Prediction
from vprl.train.evaluation.modes import ModeConfig, run_mode
from vprl.train.evaluation.plan import mode_configs
from vprl.train.prompts.conversation import HEADER, INSTRUCTION, RepairFormat
from vprl.train.sampling.generator import SamplingSettings

SENTINEL = "zebra-sentinel-4711"


class RepairPolicy(ScriptedPolicy):
    def write(self, prompt: str, k: int, sampling: SamplingSettings) -> str:
        if "\n" + HEADER not in prompt:
            return super().write(prompt, k, sampling)
        first = prompt.split("\n" + HEADER)[0]
        query_line = first[: first.rfind("\ndef ")].rsplit("\n", 1)[-1]
        assert query_line.startswith("# "), query_line
        query = query_line[2:]
        if self.fix_on_feedback:
            return self.gold[query]
        return super().write(first[: first.rfind("\ndef ")] + "\ndef execute_command(image) -> str:", k, sampling)

    def conversations(self) -> list[str]:
        return [p for p in self.prompts if "\n" + HEADER in p]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    build_world(root, val=16)
    return root


@pytest.fixture(scope="module")
def tasks(world):
    return load_shapes_tasks(world, ["val", "refcoco"])


@pytest.fixture(scope="module")
def runners():
    with SyncRunner(ToolHost(build_backend("shapes")), RunnerConfig(slots=2)) as runner:
        yield runner, None, build_judge({}, runner)


def test_repair_stops_at_the_first_program_that_runs(world, tasks, runners):
    policy = RepairPolicy(all_gold(world), mistake="crash")
    examples = tasks["val"] + tasks["refcoco"]
    single = run_mode(context(policy, runners, tuned=False), examples, ModeConfig("single"))
    crashed = {p.example_id for p in single if p.status == "runtime_error"}
    assert len(crashed) >= 5
    start = len(policy.prompts)
    preds = run_mode(context(policy, runners, tuned=False), examples, ModeConfig("repair", turns=3))
    assert all(p.status == "ok" for p in preds)
    assert {p.example_id for p in preds if p.attempts == 2} == crashed  # stopped as soon as it ran
    assert all(p.attempts == 1 for p in preds if p.example_id not in crashed)
    shown = policy.prompts[start + len(examples) :]
    assert len(shown) == len(crashed) and shown == policy.conversations()[-len(crashed) :]
    for prompt in shown:  # prompt, first body, feedback block, signature again
        assert prompt.count("\n" + HEADER) == 1 and INSTRUCTION in prompt
        assert "NameError" in prompt and prompt.rsplit("\n", 1)[-1].startswith("def execute_command(image) -> ")
        assert "ImagePatch(img)" in prompt  # the failed program's body is in the conversation
    # The episode's turns are recorded, with the feedback each got, and survive the JSON round trip.
    pred = next(p for p in preds if p.example_id in crashed)
    assert [t["status"] for t in pred.turns] == ["runtime_error", "ok"]
    assert "error" in pred.turns[0]["feedback"]["parts"] and pred.turns[1]["feedback"] is None
    assert Prediction.from_json(pred.to_json()) == pred
    assert score(examples[:16], preds[:16]) > score(examples[:16], single[:16])


def test_a_stubborn_policy_gets_every_turn_in_one_conversation(world, tasks, runners):
    policy = RepairPolicy(all_gold(world), mistake="crash", fix_on_feedback=False)
    examples = tasks["val"]
    preds = run_mode(context(policy, runners, tuned=False), examples, ModeConfig("repair", turns=3))
    failing = [p for p in preds if p.status != "ok"]
    assert failing and all(p.attempts == 3 and len(p.turns) == 3 for p in failing)
    # The third program is written after both feedback blocks, as in a training episode.
    assert max(p.count("\n" + HEADER) for p in policy.conversations()) == 2


def test_repair_until_the_unit_tests_pass_shows_the_failed_tests(world, tasks, runners):
    policy = RepairPolicy(all_gold(world))
    examples = tasks["val"]
    single = run_mode(context(policy, runners, tuned=False), examples, ModeConfig("single"))
    start = len(policy.prompts)
    mode = ModeConfig("repair", turns=2, stop_when="passed", show=("error", "unit_tests"))
    preds = run_mode(context(policy, runners, tuned=False), examples, mode)
    shown = [p for p in policy.prompts[start:] if "\n" + HEADER in p]
    assert shown and len(shown) <= sum(policy.mistaken(e.query) for e in examples)  # only failing ones
    tests = [p for p in shown if "# It failed these visual unit tests:" in p]
    assert tests
    for prompt in tests:  # ViUniT's structure: the test image's content, the expected answer, the output
        line = next(x for x in prompt.split("\n") if x.startswith("#   image content: "))
        assert "; expected answer: " in line and "; program output: " in line
    assert all(p.unit_test_score is not None for p in preds)
    assert all(p.turns[0]["components"]["unit_tests"] is not None for p in preds)
    assert score(examples, preds) > score(examples, single)
    with pytest.raises(ValueError, match="needs unit tests"):
        run_mode(context(policy, (runners[0], None, None), tuned=False), examples, mode)


def test_keep_best_takes_the_better_scoring_program(world, tasks, runners):
    stubborn = RepairPolicy(all_gold(world), fix_on_feedback=False)
    examples = tasks["val"]
    mode = ModeConfig("repair", turns=2, stop_when="passed", keep="best")
    preds = run_mode(context(stubborn, runners, tuned=False), examples, mode)
    for p in preds:
        scores = [t["components"]["unit_tests"] for t in p.turns if t["status"] == "ok"]
        if scores and all(s is not None for s in scores):
            assert p.unit_test_score == max(scores)


def test_later_turns_are_greedy_or_sampled_as_in_training(world, tasks, runners):
    """`later_turns: sampled` writes the programs after the first at the mode's temperature (as a repair
    run's training episodes are written); the first program stays greedy, and greedy is the default."""
    examples = tasks["val"]
    temperatures = {}
    for later in ("greedy", "sampled"):
        policy = RepairPolicy(all_gold(world))
        (mode,) = mode_configs(EvalConfig(modes="repair", stop_when="passed", later_turns=later))
        assert mode.later_turns == later
        preds = run_mode(context(policy, runners, tuned=False), examples, mode)
        assert any(len(p.turns) == 2 for p in preds) and policy.conversations()
        temperatures[later] = [temperature for _, temperature, *_ in policy.calls]
    assert temperatures["greedy"] == [0.0, 0.0]
    assert temperatures["sampled"] == [0.0, 1.0]
    (mode,) = mode_configs(EvalConfig(modes="repair", later_turns="sampled"))
    assert mode.label.endswith(", later ones sampled") and "written again (sampled)" in mode.description
    with pytest.raises(ValueError, match="later_turns"):
        ModeConfig("repair", later_turns="beam")


def test_verdict_is_refused_in_an_evaluation():
    with pytest.raises(ValueError, match="verdict"):
        ModeConfig("repair", show=("error", "verdict"))
    with pytest.raises(ValueError, match="verdict"):
        mode_configs(EvalConfig(modes="repair", show="error,verdict"))
    with pytest.raises(ValueError, match="stop_when"):
        ModeConfig("repair", stop_when="right")
    with pytest.raises(ValueError, match="keep"):
        ModeConfig("repair", keep="last")


def test_the_repair_keys_of_the_evaluation_config():
    (mode,) = mode_configs(
        EvalConfig(
            modes="repair", turns=3, stop_when="passed", show="error,unit_tests", keep="best", pass_threshold=0.8
        )
    )
    assert (mode.turns, mode.stop_when, mode.show, mode.keep) == (3, "passed", ("error", "unit_tests"), "best")
    assert mode.needs_judge and not ModeConfig("repair").needs_judge
    assert mode.label == "repair, up to 3 programs until unit tests reach 0.8, best by unit tests"
    assert ModeConfig("repair").label == "repair, up to 2 programs until one runs"
    assert "error, unit_tests" in mode.description and mode.description.endswith("the programs alone, no fallback")
    # Only the repair mode reads them: other modes keep the defaults.
    single, repair = mode_configs(EvalConfig(modes="single,repair", turns=4))
    assert single.turns == 2 and repair.turns == 4


def test_the_repair_mode_has_a_threshold_of_its_own(world, tasks, runners):
    cfg = dict(modes="reprompt_tests,repair", stop_when="passed", pass_threshold=1.0)
    reprompt, repair = mode_configs(EvalConfig(**cfg, repair_pass_threshold=0.0))
    assert (reprompt.pass_threshold, repair.pass_threshold) == (1.0, 0.0)
    assert repair.label.endswith("until unit tests reach 0")
    assert [m.pass_threshold for m in mode_configs(EvalConfig(**cfg))] == [1.0, 1.0]  # unset: the shared one
    # At 0 every program that runs passes: only those that do not run are sent back.
    examples = tasks["val"]
    sent_back = {}
    for threshold in (1.0, 0.0):
        policy = RepairPolicy(all_gold(world))
        (mode,) = mode_configs(EvalConfig(modes="repair", stop_when="passed", repair_pass_threshold=threshold))
        preds = run_mode(context(policy, runners, tuned=False), examples, mode)
        sent_back[threshold] = [p.turns[0]["status"] for p in preds if len(p.turns) > 1]
    assert any(status == "ok" for status in sent_back[1.0])
    assert all(status != "ok" for status in sent_back[0.0])
    assert len(sent_back[0.0]) < len(sent_back[1.0])


@pytest.mark.parametrize(
    ("mode", "mistake"),
    [
        (ModeConfig("repair", turns=3, stop_when="passed", show=("error", "trace", "unit_tests")), "mutant"),
        (ModeConfig("repair", turns=2), "crash"),
        (ModeConfig("reprompt_tests", iterations=1), "mutant"),
        (ModeConfig("self_debug", iterations=1), "crash"),
    ],
    ids=["repair_passed", "repair_ran", "reprompt_tests", "self_debug"],
)
def test_no_gold_answer_reaches_a_prompt(world, tasks, runners, mode, mistake):
    policy = RepairPolicy(all_gold(world), wrong_share=0.8, mistake=mistake)
    examples = [replace(e, answers=(SENTINEL,) * max(1, len(e.answers))) for e in tasks["val"]]
    preds = run_mode(context(policy, runners, tuned=False), examples, mode)
    assert any(p.attempts > 1 for p in preds)  # feedback was shown
    assert not any(SENTINEL in p for p in policy.prompts)
    assert not any(SENTINEL in str(p.turns) for p in preds)


def test_a_two_turn_conversation_is_framed_as_user_and_model_turns():
    pytest.importorskip("transformers")
    from test_prompts_framing import GEMMA_TEMPLATE, _bpe
    from transformers import PreTrainedTokenizerFast

    from vprl.train.prompts import encode_prompt, frame_prompt

    tok = _bpe(["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"], bos="<bos>")
    gemma = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", padding_side="left"
    )
    gemma.chat_template = GEMMA_TEMPLATE
    signature = "def execute_command(image) -> str:"
    prompt = f"# how many circles?\n{signature}"
    body = '\n    return ImagePatch(img).simple_query("how many circles?")'
    feedback = Feedback(("error",), "It raised an exception: NameError: name 'img' is not defined")
    text = prompt + body + RepairFormat(gemma, "plain").block_text(feedback, signature)

    assert frame_prompt(text, gemma, "plain") == text  # plain framing: the text as it is
    framed = frame_prompt(text, gemma, "chat")
    opened = [framed.find(m) for m in ("<start_of_turn>user", "<start_of_turn>model")]
    assert framed.count("<start_of_turn>user\n") == 2 and framed.count("<start_of_turn>model\n") == 2
    turns = [part.split("\n", 1) for part in framed.split("<start_of_turn>")[1:]]
    assert [role for role, _ in turns] == ["user", "model", "user", "model"], opened
    assert turns[0][1] == "# how many circles?<end_of_turn>\n"
    assert turns[1][1] == signature + body + "<end_of_turn>\n"
    assert turns[2][1].startswith(HEADER) and "# It raised an exception: NameError" in turns[2][1]
    assert turns[2][1].endswith(INSTRUCTION + "<end_of_turn>\n")
    assert turns[3][1] == signature  # the open model turn, prefilled with the signature
    ids = encode_prompt(framed, gemma)
    assert ids[0] == gemma.bos_token_id and ids.count(gemma.bos_token_id) == 1
    # One turn: framed as before, the signature moved into the model turn.
    one = frame_prompt(prompt, gemma, "chat")
    assert one.count("<start_of_turn>") == 2 and one.endswith("<start_of_turn>model\n" + signature)
