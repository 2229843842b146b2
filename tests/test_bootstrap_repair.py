"""The tiny policy's repair examples (`BootstrapConfig.repair_share`): a wrong program, the feedback
its real sandboxed run gets in a repair episode, and the gold body as the completion; no label
anywhere in them; the default recipe's cache key unchanged; a quick bootstrap with them runs and
reports its repair figure."""

import dataclasses
import json

import numpy as np
import pytest
from test_bootstrap import TINY

from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
from vprl.data.shapes.mutations import mutate
from vprl.data.shapes.tasks import load_shapes_tasks
from vprl.rewards.feedback import Feedback
from vprl.train.bootstrap import config as bootstrap_config
from vprl.train.bootstrap.check import PolicyEval, open_runner
from vprl.train.bootstrap.fit import BootstrapConfig, main
from vprl.train.bootstrap.pairs import body
from vprl.train.bootstrap.repair_pairs import (
    REPAIR_PAIRS_FILE,
    WRONG_NAMES,
    broken,
    draw_wrong,
    dropped_bracket,
    load_repair_pairs,
    misnamed_method,
    repair_loop,
    repair_pairs,
    wrong_noun,
)
from vprl.train.prompts import PromptConfig, build_prompt
from vprl.train.prompts.conversation import HEADER, RepairFormat, opener_of, signature_of

SENTINEL = "zq-sentinel-answer-7731"


def test_the_default_recipe_keeps_its_cache_key():
    assert BootstrapConfig().key() == "0a305eed0f9da8d5" == BootstrapConfig(repair_share=0.0).key()
    assert BootstrapConfig(repair_share=0.1).key() != BootstrapConfig().key()
    # the repair examples' text is in the key: a policy taught the earlier block is not reused
    with pytest.MonkeyPatch.context() as patch:
        earlier = BootstrapConfig(repair_share=0.1).key()
        patch.setattr(bootstrap_config, "REPAIR_FORMAT", 1)
        assert BootstrapConfig(repair_share=0.1).key() != earlier
        assert BootstrapConfig().key() == "0a305eed0f9da8d5"
    with pytest.raises(ValueError, match="repair_share"):
        BootstrapConfig(repair_share=1.0)
    assert BootstrapConfig(repair_noun_share=0.0).key() == "0a305eed0f9da8d5"
    assert BootstrapConfig(repair_share=0.1, repair_noun_share=0.3).key() != BootstrapConfig(repair_share=0.1).key()
    with pytest.raises(ValueError, match="repair_noun_share"):
        BootstrapConfig(repair_noun_share=1.5)
    shown = ["error", "trace", "unit_tests", "unasked"]
    assert BootstrapConfig(repair_feedback=["error", "trace", "unit_tests"]).key() == "0a305eed0f9da8d5"
    assert BootstrapConfig(repair_share=0.1, repair_feedback=shown).key() != BootstrapConfig(repair_share=0.1).key()
    with pytest.raises(ValueError, match="repair_feedback.*never a label"):
        BootstrapConfig(repair_feedback=["error", "verdict"])


def test_a_wrong_noun_names_another_shape_at_its_first_use():
    program = (
        "def execute_command(image):\n    image_patch = ImagePatch(image)\n"
        '    a = image_patch.find("red star")[0]\n    b = image_patch.find("star")\n    return "yes"\n'
    )
    rng = np.random.default_rng(0)
    slips = {wrong_noun(program, rng) for _ in range(40)}
    names = {s.split('find("red ')[1].split('"')[0] for s in slips}
    assert names == {"circle", "square", "triangle", "hexagon"}  # every other shape, never the question's
    assert all(s.count('find("star")') == 1 for s in slips)  # only its first use
    assert all(compile(s, "<p>", "exec") for s in slips)
    assert wrong_noun('x = image_patch.find("thing")', rng) == 'x = image_patch.find("thing")'


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
def episodes(world, tmp_path_factory):
    """Episodes on the shapes tools (pixels): the unit tests' images are drawn, not in the world."""
    with open_runner(BootstrapConfig(tool_stack="shapes", executor_slots=2), world) as runner:
        yield repair_loop(runner, tmp_path_factory.mktemp("repair_work"))


def test_repair_examples_with_unasked_name_the_slipped_noun(world, tmp_path):
    """A bootstrap with `repair_feedback` holding `unasked`: a wrong-noun example's feedback names
    the shape its program looks for and its question never says, on the real shapes tools."""
    examples = load_shapes_tasks(world, ["train"])["train"]
    gold = load_gold_programs(world)["vqa"]
    rng = np.random.default_rng(0)
    slipped = [(ex, wrong_noun(gold[ex.query], rng)) for ex in examples]
    slipped = [(ex, p) for ex, p in slipped if p != gold[ex.query]][:4]
    assert slipped, "no training question's program names a shape"
    show = ("error", "trace", "unit_tests", "unasked")
    with open_runner(BootstrapConfig(tool_stack="shapes", executor_slots=2), world) as runner:
        loop = repair_loop(runner, tmp_path, show)
        pairs = repair_pairs(loop, [ex for ex, _ in slipped], gold, [("wrong_noun", p) for _, p in slipped])
    assert pairs, "every slipped program passed its unit tests"
    assert all("the question never says" in p.prompt for p in pairs)


def _wrong_programs(examples, gold):
    """Every example with its gold, each breaker and each mutation."""
    exs, wrong = [], []
    for ex in examples:
        program = gold[ex.query]
        options = [("gold", program), *broken(program).items(), *((m.kind, m.program) for m in mutate(program))]
        exs += [ex] * len(options)
        wrong += options
    return exs, wrong


def test_repair_pairs_hold_the_wrong_body_its_real_feedback_and_the_gold(world, episodes):
    examples = load_shapes_tasks(world, ["train"])["train"][:12]
    gold = load_gold_programs(world)["vqa"]
    exs, wrong = _wrong_programs(examples, gold)
    pairs = repair_pairs(episodes, exs, gold, wrong)
    kinds = {p.kind for p in pairs}
    assert "repair:gold" not in kinds  # the gold passes its unit tests: nothing to repair
    assert {"repair:misnamed_method", "repair:dropped_bracket"} <= kinds
    ran_wrong = kinds - {"repair:misnamed_method", "repair:dropped_bracket"}
    assert ran_wrong, "no mutation that runs failed its unit tests"
    by_id = {ex.id: ex for ex in examples}
    style = RepairFormat(None, "plain")
    seen = set()
    for pair in pairs:
        ex = by_id[pair.example_id]
        prompt = build_prompt(ex.query, PromptConfig(layout="bare"))
        assert pair.completion == body(gold[ex.query])  # the loss covers the corrected program only
        context, block = pair.prompt.split("\n" + HEADER)
        assert context.startswith(prompt) and pair.prompt.endswith("\n" + signature_of(prompt))
        wrong_body = context[len(prompt) :]
        assert wrong_body.strip() and wrong_body.strip() != pair.completion.strip()
        opener = opener_of(prompt)  # the query and the signature
        feedback_text = "\n".join(line[2:] for line in block.split("\n")[1 : -1 - len(opener.split("\n"))])
        rebuilt = prompt + wrong_body + style.block_text(Feedback((), feedback_text), opener)
        assert rebuilt == pair.prompt  # the plain repair block, as a repair episode shows it
        program_lines = (signature_of(prompt) + wrong_body).split("\n")
        if pair.kind == "repair:misnamed_method":  # the real AttributeError, naming its line
            name = block.split("has no attribute '")[1].split("'")[0]
            line = int(block.split("(line ")[1].split(":")[0])
            assert name in WRONG_NAMES.values() and f".{name}(" in program_lines[line - 1]
            seen.add("error")
        elif pair.kind == "repair:dropped_bracket":
            assert "does not parse: SyntaxError" in block
        elif "raised an exception" in block:  # a mutation that fails at run time: its error
            assert "visual unit tests" not in block
        else:  # ran, and failed visual unit tests: they are shown, never a verdict
            assert "It failed these visual unit tests:" in block and "is wrong" not in block
            seen.add("unit_tests")
    assert seen == {"error", "unit_tests"}


def test_no_label_reaches_a_repair_pair(world, episodes):
    """Unit-test feedback reads no label: the pairs are the same whatever the answers say."""
    examples = load_shapes_tasks(world, ["train"])["train"][:10]
    planted = [dataclasses.replace(ex, answers=(SENTINEL,)) for ex in examples]
    gold = load_gold_programs(world)["vqa"]
    exs, wrong = _wrong_programs(examples, gold)
    pairs = repair_pairs(episodes, exs, gold, wrong)
    exs_planted, _ = _wrong_programs(planted, gold)
    planted_pairs = repair_pairs(episodes, exs_planted, gold, wrong)
    assert pairs and planted_pairs == pairs
    assert all(SENTINEL not in json.dumps(p.to_json()) for p in planted_pairs)


def test_draws_are_the_seeds_and_break_a_share_of_programs(world):
    examples = load_shapes_tasks(world, ["train"])["train"]
    gold = load_gold_programs(world)["vqa"]
    a = draw_wrong(examples, gold, 200, np.random.default_rng([3, 3]))
    assert a == draw_wrong(examples, gold, 200, np.random.default_rng([3, 3]))
    broken_share = sum(kind in ("misnamed_method", "dropped_bracket") for kind, _ in a[1]) / len(a[1])
    assert 0.15 < broken_share < 0.45  # BROKEN_SHARE is 0.25, plus examples with no mutation
    assert "wrong_noun" not in {kind for kind, _ in a[1]}
    _, slips = draw_wrong(examples, gold, 200, np.random.default_rng([3, 3]), noun_share=0.5)
    noun_share = sum(kind == "wrong_noun" for kind, _ in slips) / len(slips)
    assert 0.3 < noun_share < 0.6  # half of the draws, of the programs with a shape to name


def test_a_quick_bootstrap_learns_repair_examples(tmp_path):
    out = tmp_path / "policy"
    args = [*TINY, "--tool_stack", "shapes", "--repair_share", "0.3", "--repair_noun_share", "0.5", "--context", "512"]
    summary = main(["--out", str(out), "--seed", "1", *args])
    info = summary["repair_examples"]
    assert info["pairs"] > 0 and sum(info["kinds"].values()) == info["pairs"]
    assert info["pairs"] <= info["wanted"] and 0 <= info["too_long"] < info["pairs"]
    mixture = summary["sft_pairs"] - info["pairs"] + info["too_long"]
    assert info["wanted"] == round(0.3 * mixture / 0.7)
    for name in ("val", "heldout"):
        repair = PolicyEval.from_json(summary["evaluation"][name]).repair
        assert repair is not None
        for how in (repair, repair["sampled"]):  # greedy, and as RL samples (2 episodes a question here)
            assert 0 <= how["first_wrong"] <= how["got_feedback"]
            for figure in ("repaired", "broken", "passed", "ran", "unchanged"):
                assert how[figure] is None or 0 <= how[figure] <= 1
        assert repair["sampled"]["got_feedback"] <= 2 * PolicyEval.from_json(summary["evaluation"][name]).overall.n
        assert repair["resample_lift"] is None  # greedy: one first program a question, nothing to compare with
        lift = repair["sampled"]["resample_lift"]
        assert lift is None or -1 <= lift <= 1
    saved = json.loads((out / "bootstrap.json").read_text())
    assert saved["evaluation"]["val"]["repair"] == summary["evaluation"]["val"]["repair"]
    assert "repair:" in (out / "bootstrap.json").read_text()  # the kinds drawn are recorded
    assert "repair:wrong_noun" in info["kinds"]
    # the pairs SFT was given are kept for a repair run to replay (repair_replay_weight)
    kept = load_repair_pairs(out / REPAIR_PAIRS_FILE)
    assert len(kept) == info["pairs"] - info["too_long"] and {p.kind for p in kept} <= set(info["kinds"])
