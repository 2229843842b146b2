"""Every inference mode on the shapes world, through the sandboxed executor with the pixel-only
`shapes` tools (the stack named `shapes`) and the rule-based visual unit tests.

The policy is `ScriptedPolicy` (tests/evaluate_helpers.py), a `Generator` test double that makes
mistakes: for most queries its greedy program is a plausible wrong one (a mutant of the gold, a
crash or a too-tight crop) and its samples mix the gold with mutants. That is legitimate here:
the modes only see programs, and knowing which ones are right is what lets the tests check that
each mode picks, repairs or refuses the way the papers describe.
"""

from dataclasses import replace

import pytest
from evaluate_helpers import ScriptedPolicy, all_gold, build_world

from vprl.data.shapes.tasks import load_shapes_tasks
from vprl.executor.host import ToolHost
from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.executor.tools.stack import build_backend
from vprl.train.evaluation.config import EvalConfig
from vprl.train.evaluation.fallback import fallback_program
from vprl.train.evaluation.judge import build_judge
from vprl.train.evaluation.metrics import dataset_metrics, headline_value
from vprl.train.evaluation.modes import EvalContext, ModeConfig, run_mode
from vprl.train.evaluation.plan import prompt_template
from vprl.train.sampling.generator import policy_sampling

SHAPES = "shapes"


_Prompts = EvalConfig(prompt_variant="vipergpt", prompt_layout="bare")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    build_world(root, val=16)
    return root


@pytest.fixture(scope="module")
def tasks(world):
    return load_shapes_tasks(world, ["val", "heldout", "winoground", "sugarcrepe", "refcoco"])


@pytest.fixture(scope="module")
def runners():
    config = RunnerConfig(slots=2)
    with (
        SyncRunner(ToolHost(build_backend(SHAPES)), config) as runner,
        SyncRunner(ToolHost(build_backend(SHAPES, min_visible=0.3)), config) as tuned,
    ):
        yield runner, tuned, build_judge({}, runner)


def context(policy, runners, seed=0, tuned=True):
    runner, tuned_runner, judge = runners
    return EvalContext(
        generator=policy,
        prompt=lambda e, previous=None: prompt_template(_Prompts, e.task).build(e.query, previous=previous),
        runner=runner,
        greedy=policy_sampling(temperature=0.0, seed=seed),
        sampling=policy_sampling(temperature=1.0, seed=seed),
        judge=judge,
        tuned_runner=tuned_runner if tuned else None,
        fallback_program=fallback_program,
    )


def score(examples, preds, **kw):
    return headline_value(dataset_metrics(examples, preds, **kw))


def test_single_and_majority(world, tasks, runners):
    policy = ScriptedPolicy(all_gold(world))
    examples = tasks["val"]
    single = run_mode(context(policy, runners), examples, ModeConfig("single"))
    assert [p.example_id for p in single] == [e.id for e in examples]
    assert all(p.attempts == 1 for p in single) and policy.calls[-1] == (len(examples), 0.0, 1, 0)
    greedy = [policy.write(p, 0, policy_sampling(temperature=0.0)) for p in policy.prompts]
    assert [p.program.strip() for p in single] == [g.strip() for g in greedy]
    majority = run_mode(context(policy, runners), examples, ModeConfig("majority", n_programs=5))
    assert all(p.attempts == 5 for p in majority) and policy.calls[-1][2] == 5
    assert score(examples, single) < 0.9
    assert score(examples, majority) > score(examples, single)


def test_unit_test_selection_beats_a_single_program(world, tasks, runners):
    policy = ScriptedPolicy(all_gold(world))
    figures = {}
    for name in ("val", "heldout"):
        examples = tasks[name]
        single = run_mode(context(policy, runners), examples, ModeConfig("single"))
        chosen = run_mode(context(policy, runners), examples, ModeConfig("unit_test_select", n_programs=4))
        assert all(p.unit_test_score is not None for p in chosen)
        figures[name] = (score(examples, single), score(examples, chosen))
    print("\nbest-program selection (4 programs x 5 unit tests) vs one greedy program, headline %:")
    for name, (one, best) in figures.items():
        print(f"  shapes:{name:<11} single {100 * one:5.1f}   unit_test_select {100 * best:5.1f}")
    for name, (one, best) in figures.items():
        assert best >= one + 0.15, (name, one, best)


def test_answer_refusal_below_the_unit_test_threshold(world, tasks, runners):
    # Samples never hold the gold of a mistaken query: there even the best candidate is a mutant.
    gold = all_gold(world)
    policy = ScriptedPolicy(gold, gold_in_samples=0.0)
    examples = tasks["val"] + tasks["heldout"]
    mode = ModeConfig("unit_test_select", n_programs=3, refuse_below=0.8)
    preds = run_mode(context(policy, runners), examples, mode)
    refused = [p for p in preds if p.refused]
    by_id = {e.id: e for e in examples}
    mutants = [p for p in preds if p.program.strip() != gold[by_id[p.example_id].query].strip()]
    assert len(refused) >= 0.4 * len(mutants) and len(refused) >= 4
    assert all(p.unit_test_score < 0.8 for p in refused)
    assert all(p in mutants for p in refused)  # a gold program is never refused
    assert all(p.final_answer(use_fallback=True) is None for p in refused)
    m = dataset_metrics(examples, preds)
    assert m.rates["refusal_rate"] == len(refused) / len(preds)
    # The answers it holds back are less often right than the ones it gives (a mutant can still be
    # right on one image by chance: that is what its unit tests catch).
    answered = [p for p in preds if not p.refused]
    on_refused = score([by_id[p.example_id] for p in refused], [replace(p, refused=False) for p in refused])
    on_answered = score([by_id[p.example_id] for p in answered], answered)
    print(
        f"\nrefusal below 0.8: {len(refused)}/{len(preds)} refused; accuracy the refused answers would have had "
        f"{100 * on_refused:.0f}%, of the answers given {100 * on_answered:.0f}%"
    )
    assert on_refused < on_answered


def test_reprompting_with_unit_test_feedback(world, tasks, runners):
    policy = ScriptedPolicy(all_gold(world))
    examples = tasks["val"]
    single = run_mode(context(policy, runners), examples, ModeConfig("single"))
    start = len(policy.prompts)
    preds = run_mode(context(policy, runners), examples, ModeConfig("reprompt_tests", iterations=2))
    shown = [p for p in policy.prompts[start:] if "An earlier attempt" in p]
    assert shown and all("failed visual unit tests" in p and "expected" in p for p in shown)
    assert len(shown) <= sum(policy.mistaken(e.query) for e in examples)  # only failing programs
    mistaken = {e.id for e in examples if policy.mistaken(e.query)}
    assert sum(p.attempts > 1 for p in preds if p.example_id in mistaken) >= 0.5 * len(mistaken)
    assert score(examples, preds) > score(examples, single)
    # A policy that ignores the feedback: the better-scoring program is kept, never a worse one.
    stubborn = ScriptedPolicy(all_gold(world), fix_on_feedback=False)
    kept = run_mode(context(stubborn, runners), examples, ModeConfig("reprompt_tests", iterations=1))
    assert score(examples, kept) >= score(examples, single)


@pytest.mark.parametrize("feedback", ["error", "scratch"])
def test_self_debugging(world, tasks, runners, feedback):
    policy = ScriptedPolicy(all_gold(world), mistake="crash")
    examples = tasks["val"] + tasks["refcoco"]
    single = run_mode(context(policy, runners), examples, ModeConfig("single"))
    crashed = sum(p.status == "runtime_error" for p in single)
    assert crashed >= 5
    start = len(policy.prompts)
    preds = run_mode(context(policy, runners), examples, ModeConfig("self_debug", feedback=feedback, iterations=2))
    retries = policy.prompts[start + len(examples) :]
    assert len(retries) >= crashed
    if feedback == "error":
        assert all("An earlier attempt" in p and "NameError" in p for p in retries)
        assert all(p.status == "ok" for p in preds)
    else:  # fresh samples of the same prompt, no error shown
        assert not any("An earlier attempt" in p for p in retries)
        assert all(call[1] == 1.0 for call in policy.calls[-2:] if call[0] < len(examples))
        assert sum(p.status == "runtime_error" for p in preds) < crashed
    assert sum(p.attempts > 1 for p in preds) == crashed
    assert score(examples[:16], preds[:16]) > score(examples[:16], single[:16])


def test_self_tuning_lowers_the_visibility_threshold(world, tasks, runners):
    policy = ScriptedPolicy(all_gold(world), mistake="tight_crop", wrong_share=1.0)
    examples = tasks["val"]
    single = run_mode(context(policy, runners), examples, ModeConfig("single"))
    found_nothing = [p for p in single if p.status == "runtime_error" and "IndexError" in (p.error or "")]
    assert len(found_nothing) >= 4
    tuned = run_mode(context(policy, runners), examples, ModeConfig("self_tuning"))
    retried = {p.example_id for p in found_nothing}
    assert all(p.attempts == 2 and p.status == "ok" for p in tuned if p.example_id in retried)
    assert all(p.attempts == 1 for p in tuned if p.example_id not in retried)
    assert score(examples, tuned) > score(examples, single)
    with pytest.raises(ValueError, match="tuned tool stack"):
        run_mode(context(policy, runners, tuned=False), examples, ModeConfig("self_tuning"))


def test_fallback_is_reported_separately(world, tasks, runners):
    policy = ScriptedPolicy(all_gold(world), mistake="crash")
    for name in ("val", "refcoco"):
        examples = tasks[name]
        plain = run_mode(context(policy, runners), examples, ModeConfig("single"))
        preds = run_mode(context(policy, runners), examples, ModeConfig("single", fallback=True))
        assert [p.answer for p in preds] == [p.answer for p in plain]  # programs' own answers untouched
        assert any(p.fallback_answer is not None for p in preds)
        assert all(p.fallback_answer is None for p in preds if p.status == "ok")
        without = dataset_metrics(examples, preds)
        assert without == dataset_metrics(examples, plain)
        with_fb = dataset_metrics(examples, preds, use_fallback=True)
        assert with_fb.rates["fallback_rate"] > 0 and without.rates["fallback_rate"] == 0
        assert headline_value(with_fb) > headline_value(without)


def test_fallback_when_unsure_answers_low_scoring_programs_by_the_fallback(world, tasks, runners):
    """`fallback_below`: the fallback also answers programs that ran but fail their unit tests (a
    mutant that answers wrongly), scored by the judge in single mode; gold programs keep theirs."""
    gold = all_gold(world)
    policy = ScriptedPolicy(gold, wrong_share=0.7)
    examples = tasks["val"] + tasks["heldout"]
    by_id = {e.id: e for e in examples}
    only_failures = run_mode(context(policy, runners), examples, ModeConfig("single", fallback=True))
    unsure = run_mode(context(policy, runners), examples, ModeConfig("single", fallback=True, fallback_below=0.6))
    assert [p.answer for p in unsure] == [p.answer for p in only_failures]  # the no-fallback row is unchanged
    ran = [p for p in unsure if p.status == "ok"]
    assert all(p.unit_test_score is not None for p in ran)
    low = [p for p in ran if p.unit_test_score < 0.6]
    assert low and all(p.fallback_answer is not None for p in low)
    assert all(p.fallback_answer is None for p in ran if p.unit_test_score >= 0.6)
    assert all(p.unit_test_score >= 0.6 for p in ran if p.program.strip() == gold[by_id[p.example_id].query].strip())
    m = dataset_metrics(examples, unsure, use_fallback=True)
    assert (
        m.rates["fallback_rate"] > dataset_metrics(examples, only_failures, use_fallback=True).rates["fallback_rate"]
    )
    with pytest.raises(ValueError, match="fallback_below needs fallback on"):
        ModeConfig("single", fallback_below=0.5)


def test_mode_labels_read_as_words_and_the_glossary_says_what_each_row_did():
    """The program-alone row of a run with `fallback_below` is the same as without it, so it is
    named the same; the threshold is said where it acts, in the "+fallback" row's description."""
    below = ModeConfig("single", fallback=True, fallback_below=0.5)
    assert below.label == ModeConfig("single").label == "single"
    assert "scored below 0.5 on its visual unit tests" in below.fallback_description
    assert "unit tests" not in ModeConfig("single", fallback=True).fallback_description
    labels = {
        ModeConfig("majority", n_programs=3): "majority of 3",
        ModeConfig("unit_test_select", refuse_below=0.5): "best of 8 by unit tests, refusing below 0.5",
        ModeConfig("self_debug", feedback="scratch", iterations=1): "self-debugging from scratch, 1 round",
        ModeConfig("reprompt_tests"): "re-prompted on unit tests, 2 rounds",
        ModeConfig("self_tuning"): "self-tuning",
    }
    for mode, label in labels.items():
        assert mode.label == label
        assert mode.description.endswith("the programs alone, no fallback")
    assert (
        "refused (counts as wrong) when even the best scores below 0.5"
        in ModeConfig("unit_test_select", refuse_below=0.5).description
    )


def test_itm_fallback_compares_the_pair_s_two_captions(tasks, runners):
    """The fallback's CLIP-style baseline on image-text matching: the caption against the other
    caption of its pair. Against a neutral alternative it answered "yes" to nearly everything."""
    runner = runners[0]
    for name in ("winoground", "sugarcrepe"):
        examples = tasks[name]
        assert all("other_caption" in e.meta for e in examples)
        results = runner.run([(e, fallback_program(e)) for e in examples])
        assert all(r.status == "ok" for r in results), {r.status for r in results}
        answers = [r.answer for r in results]
        accuracy = sum(a == e.answers[0] for a, e in zip(answers, examples)) / len(examples)
        assert "no" in answers and accuracy > 0.6, (name, accuracy)


def test_an_answer_of_the_wrong_kind_is_a_bad_return_that_the_fallback_answers(tasks, runners):
    """A grounding program that returns "yes" and a yes/no program that returns a list of patches
    ran, but answered nothing: bad_return (an exception), so the fallback answers them. Before, they
    counted as answers scored 0 and the fallback never saw them."""
    body = {
        "refcoco": 'return "yes"',
        "winoground": 'return image_patch.find("shape")',
        "val": 'return image_patch.find("shape")[0]',  # a patch for a question: a box, not text
    }
    for name, line in body.items():
        examples = tasks[name][:8]  # two whole Winoground groups
        program = f"def execute_command(image):\n    image_patch = ImagePatch(image)\n    {line}\n"
        policy = ScriptedPolicy({e.query: program for e in examples}, wrong_share=0.0)
        preds = run_mode(context(policy, runners), examples, ModeConfig("single", fallback=True))
        assert {p.status for p in preds} == {"bad_return"}, (name, [p.error for p in preds])
        assert all(p.answer is None and "program must return" in p.error for p in preds)
        assert any(p.fallback_answer is not None for p in preds), name  # none where its detector finds nothing
        assert dataset_metrics(examples, preds).rates["exception_rate"] == 1.0
    from vprl.rewards.correctness import answer_kind_error

    assert answer_kind_error("grounding", {"box": [0, 0, 4, 4]}) is None
    assert answer_kind_error("itm", True) is None and answer_kind_error("vqa", 2) is None
    assert "yes or no" in answer_kind_error("itm", [])
