"""The tiny policy's repair examples (`BootstrapConfig.repair_share`): a wrong program, the feedback
its real sandboxed run gets, and the gold body as the completion; never the question's answer in
the feedback; the default recipe's cache key unchanged; a quick bootstrap with them runs and reports
its repair figure."""

import dataclasses
import json

import pytest
from test_bootstrap import TINY

from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
from vprl.data.shapes.mutations import mutate
from vprl.data.shapes.tasks import load_shapes_tasks
from vprl.executor.host import ToolHost
from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.rewards.feedback import Feedback
from vprl.train.bootstrap.check import PolicyEval, tool_backend
from vprl.train.bootstrap.fit import BootstrapConfig, body, main
from vprl.train.bootstrap.repair_pairs import WRONG_NAMES, broken, dropped_bracket, misnamed_method, repair_pairs
from vprl.train.prompts import PromptConfig, build_prompt
from vprl.train.prompts.conversation import HEADER, RepairFormat, signature_of

SENTINEL = "zq-sentinel-answer-7731"


def test_the_default_recipe_keeps_its_cache_key():
    assert (
        BootstrapConfig().key() == "0a305eed0f9da8d5" and BootstrapConfig(repair_share=0.0).key() == "0a305eed0f9da8d5"
    )
    assert BootstrapConfig(repair_share=0.1).key() != BootstrapConfig().key()
    with pytest.raises(ValueError, match="repair_share"):
        BootstrapConfig(repair_share=1.0)


def test_breakers_do_not_run():
    program = 'def execute_command(image):\n    image_patch = ImagePatch(image)\n    return str(len(image_patch.find("circles")))\n'
    assert ".find_all(" in misnamed_method(program)
    with pytest.raises(SyntaxError):
        compile(dropped_bracket(program), "<p>", "exec")
    assert set(broken(program)) == {"misnamed_method", "dropped_bracket"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("repair_pairs") / "world"
    build_dataset(
        BuildConfig(out=str(root), workers=1, train=16, val=6, winoground=0, sugarcrepe=0, refcoco=0, seed=5)
    )
    return root


@pytest.fixture(scope="module")
def runner(world):
    with SyncRunner(ToolHost(tool_backend("oracle", world)), RunnerConfig(slots=2)) as r:
        yield r


def _wrong_programs(examples, gold):
    """Every example with its gold (right: no pair), each breaker and each mutation."""
    exs, wrong = [], []
    for ex in examples:
        program = gold[ex.query]
        options = [("gold", program), *broken(program).items(), *((m.kind, m.program) for m in mutate(program))]
        exs += [ex] * len(options)
        wrong += options
    return exs, wrong


def test_repair_pairs_hold_the_wrong_body_its_real_feedback_and_the_gold(world, runner):
    examples = load_shapes_tasks(world, ["train"])["train"][:12]
    gold = load_gold_programs(world)["vqa"]
    exs, wrong = _wrong_programs(examples, gold)
    pairs = repair_pairs(exs, gold, wrong, runner)
    kinds = {p.kind for p in pairs}
    assert "repair:gold" not in kinds  # a right program is not a repair example
    assert {"repair:misnamed_method", "repair:dropped_bracket"} <= kinds and len(kinds) >= 4
    by_id = {ex.id: ex for ex in examples}
    style = RepairFormat(None, "plain")
    for pair in pairs:
        ex = by_id[pair.example_id]
        prompt = build_prompt(ex.query, PromptConfig(layout="bare"))
        assert pair.completion == body(gold[ex.query])  # the loss covers the corrected program only
        context, block = pair.prompt.split("\n" + HEADER)
        assert context.startswith(prompt) and pair.prompt.endswith("\n" + signature_of(prompt))
        assert HEADER not in pair.completion and pair.completion not in pair.prompt
        wrong_body = context[len(prompt) :]
        assert wrong_body.strip() and wrong_body.strip() != pair.completion.strip()
        feedback_text = "\n".join(line[2:] for line in block.split("\n")[1:-2])
        rebuilt = prompt + wrong_body + style.block_text(Feedback((), feedback_text), signature_of(prompt))
        assert rebuilt == pair.prompt  # the plain repair block, as a repair episode shows it
        program_lines = (signature_of(prompt) + wrong_body).split("\n")
        if pair.kind == "repair:misnamed_method":  # the real AttributeError, naming its line
            name = block.split("AttributeError: ImagePatch has no attribute '")[1].split("'")[0]
            line = int(block.split("(line ")[1].split(":")[0])
            assert name in WRONG_NAMES.values() and f".{name}(" in program_lines[line - 1]
        elif pair.kind == "repair:dropped_bracket":
            assert "does not parse: SyntaxError" in block and "(line " in block
        elif "It returned" in block:  # ran and answered wrong: its trace and the verdict
            assert "Its tool calls" in block and "is wrong." in block


def test_no_reference_answer_reaches_a_repair_pair(world, runner):
    examples = load_shapes_tasks(world, ["train"])["train"][:10]
    planted = [dataclasses.replace(ex, answers=(SENTINEL,)) for ex in examples]
    gold = load_gold_programs(world)["vqa"]
    exs, wrong = _wrong_programs(planted, gold)
    pairs = repair_pairs(exs, gold, wrong, runner)
    assert len(pairs) == len(wrong)  # every program is wrong against the sentinel: even the gold
    assert all(SENTINEL not in json.dumps(p.to_json()) for p in pairs)
    assert sum("is wrong." in p.prompt for p in pairs) >= len(examples)  # the verdict is shown, the label never


def test_a_quick_bootstrap_learns_repair_examples(tmp_path):
    out = tmp_path / "policy"
    summary = main(["--out", str(out), "--seed", "1", *TINY, "--repair_share", "0.3", "--context", "512"])
    info = summary["repair_examples"]
    assert info["pairs"] > 0 and info["pairs"] - info["too_long"] > 0
    assert (
        sum(info["kinds"].values()) == info["pairs"]
        and summary["key"] == BootstrapConfig(out=str(out), seed=1, repair_share=0.3, **_tiny(context=512)).key()
    )
    for name in ("val", "heldout"):
        repair = PolicyEval.from_json(summary["evaluation"][name]).repair
        assert repair is not None and repair["first_wrong"] >= 0
        assert repair["repaired"] is None or 0 <= repair["repaired"] <= 1
    saved = json.loads((out / "bootstrap.json").read_text())
    assert saved["evaluation"]["val"]["repair"] == summary["evaluation"]["val"]["repair"]


def _tiny(**override):
    values = {}
    for i in range(0, len(TINY), 2):
        text = TINY[i + 1]
        try:
            values[TINY[i][2:]] = int(text)
        except ValueError:
            values[TINY[i][2:]] = text
    return {**values, **override}
