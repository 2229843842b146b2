"""The visual unit-test reward end to end on the shapes world, without labels: rule-based tests,
layout-rendered images, caches, scoring through the sandboxed executor with the pixel-only
`shapes` tools, and separation of gold from mutated programs."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
from vprl.data.shapes.mutations import mutation_pairs
from vprl.data.shapes.tasks import load_shapes_tasks
from vprl.executor.host import ToolHost
from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.executor.tools.shapes import segment
from vprl.executor.tools.stack import build_backend
from vprl.rewards.compose import RewardComposer, RewardConfig, RewardSpec
from vprl.rewards.registry import build_reward
from vprl.rewards.unit_tests.layout import Layout, LayoutError, ShapesLayoutGenerator, layout_from_description
from vprl.rewards.unit_tests.parsing import parse_tests
from vprl.rewards.unit_tests.protocols import build_generator, build_writer, generator_names, writer_names
from vprl.rewards.unit_tests.reward import ProgramReport, UnitTestReward, UnitTestRewardConfig
from vprl.rewards.unit_tests.rule_writer import ShapesRuleWriter, match_template


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    build_dataset(BuildConfig(out=str(root), train=10, val=30, seed=5, winoground=6, sugarcrepe=3, refcoco=2))
    return root


@pytest.fixture(scope="module")
def runner():
    with SyncRunner(ToolHost(build_backend("shapes")), RunnerConfig(slots=2)) as r:
        yield r


def paired_auc(gold: list[float], wrong: list[float]) -> float:
    wins = [1.0 if g > w else 0.5 if g == w else 0.0 for g, w in zip(gold, wrong, strict=True)]
    return sum(wins) / len(wins)


# -- layout path -----------------------------------------------------------------------------------
def test_layout_follows_the_description_and_the_shapes_tools_see_it():
    gen = ShapesLayoutGenerator()
    text = "From left to right: a small green triangle, a large red circle and a small blue square; no yellow stars."
    layout = gen.layout(text, seed=3)
    assert [o.phrase for o in layout.objects] == ["small green triangle", "large red circle", "small blue square"]
    xs = [o.center[0] for o in layout.objects]
    assert xs[0] + 16 <= xs[1] and xs[1] + 16 <= xs[2]
    assert layout.negative == ("yellow star",)
    assert Layout.from_json(layout.to_json()) == layout
    image = gen.generate(text, seed=3)
    seen = sorted(segment(np.asarray(image)), key=lambda b: b.x0)
    assert [(b.color, b.shape, b.size) for b in seen] == [
        ("green", "triangle", "small"),
        ("red", "circle", "large"),
        ("blue", "square", "small"),
    ]
    # deterministic per (description, seed); another seed moves things
    assert np.array_equal(np.asarray(gen.generate(text, 3)), np.asarray(image))
    assert gen.layout(text, 4) != layout


def test_layout_relations_regions_counts_and_references():
    rel = layout_from_description("A large red circle to the right of the blue square, and two small stars.", 0)
    circle, square = rel.objects[0], rel.objects[1]
    assert (circle.shape, square.shape) == ("circle", "square") and circle.center[0] >= square.center[0] + 16
    assert [o.shape for o in rel.objects].count("star") == 2
    top = layout_from_description("a small cyan hexagon in the top half of the image and a red object", 1)
    assert top.objects[0].center[1] <= 128 - 14 and top.objects[1].color == "red"
    excluded = layout_from_description("three circles; there are no red circles and no blue circles", 2)
    assert len(excluded.objects) == 3 and not {o.color for o in excluded.objects} & {"red", "blue"}
    assert layout_from_description("An empty grey background.", 0).objects == ()
    with pytest.raises(LayoutError, match="no object"):
        layout_from_description("a dog chasing a ball", 0)
    with pytest.raises(LayoutError, match="contradict"):
        layout_from_description("a red circle left of a blue square. the blue square left of the red circle", 0)


# -- rule-based writer -----------------------------------------------------------------------------
def test_rule_writer_reads_every_world_template_and_covers_answers(world):
    gold = load_gold_programs(world)
    writer = ShapesRuleWriter()
    families = Counter()
    for task in ("vqa", "itm"):
        for query in gold[task]:
            found = match_template(query)
            assert found is not None, query
            families[found[0]] += 1
            tests = writer.write_one(query)
            assert len(tests) >= 6 and len({t.answer for t in tests}) >= 2, (query, tests)
            for t in tests:  # every description can be laid out
                layout_from_description(t.caption, 0)
    assert len(families) >= 15 and not writer.warnings
    # query-only: it neither needs nor reads the question's image or labels
    assert writer.sees_program is False
    assert writer.write(["Is there a red circle?"]) == writer.write(["Is there a red circle?"], ["whatever"])


def test_unrecognised_query_gives_no_tests_and_a_counted_warning():
    writer = build_writer("shapes_rules")
    assert writer.write(["What is the meaning of life?", "Is there a red circle?"])[0] == []
    assert writer.warnings["unrecognised_query"] == 1


def test_unknown_writer_or_generator_names_list_the_valid_ones():
    assert "shapes_rules" in writer_names() and "shapes_layout" in generator_names()
    with pytest.raises(ValueError, match=r"registered writers: \[.*'shapes_rules'"):
        build_writer("gpt7")
    with pytest.raises(ValueError, match=r"registered generators: \[.*'shapes_layout'"):
        build_generator("dalle9")
    with pytest.raises(ValueError, match="bad settings"):
        build_generator("shapes_layout", colour_depth=3)
    with pytest.raises(ValueError, match="unknown sampler"):
        UnitTestRewardConfig(sampler="best")


# -- the reward ------------------------------------------------------------------------------------
def test_second_scoring_reuses_tests_and_images_across_calls_and_runs(world, runner, tmp_path):
    gold = load_gold_programs(world)["vqa"]
    queries = sorted(gold)[:4]
    programs = [gold[q] for q in queries]
    wrong = ['def execute_command(image):\n    return "purple"\n'] * len(queries)
    qs, ps = queries * 2 + queries, programs * 2 + wrong  # each query with three programs, two the same
    reward = build_reward("unit_tests", resources={"runner": runner}, cache_dir=str(tmp_path), num_tests=4)
    first = reward.evaluate(qs, ps)
    stats = reward.stats
    assert stats["tests_written"] == len(queries) and stats["tests_reused"] == 0
    assert stats["images_generated"] == len({o.caption for r in first for o in r.outcomes}) > 0
    assert stats["images_reused"] == 0 and stats["executions"] <= 2 * len(queries) * 4
    assert reward.evaluate(qs, ps) == first
    again = reward.stats
    assert again["tests_written"] == stats["tests_written"] and again["images_generated"] == stats["images_generated"]
    assert again["tests_reused"] == len(queries) and again["images_reused"] == stats["images_generated"]
    # a new run on the same cache directory: nothing written or drawn either
    fresh = build_reward("unit_tests", resources={"runner": runner}, cache_dir=str(tmp_path), num_tests=4)
    assert fresh.evaluate(qs, ps) == first
    assert fresh.stats["tests_written"] == 0 and fresh.stats["images_generated"] == 0
    assert all(len(r.outcomes) == 4 for r in first)
    assert all(ProgramReport.from_json(r.to_json()) == r for r in first)


def test_gold_vs_mutant_auc_over_200_pairs(tmp_path_factory, runner):
    """Gold programs beat their mutants over 200 pairs: nearly every gold program passes its tests,
    most mutants fail theirs, and the paired AUC is high (one run of 400 programs, ~80 s on 2 cores;
    it also holds what a 24-pair version of it asserted)."""
    root = tmp_path_factory.mktemp("shapes_auc")
    build_dataset(BuildConfig(out=str(root), train=10, val=100, seed=11, winoground=30, sugarcrepe=10, refcoco=2))
    pairs = mutation_pairs(root, seed=0, n=200, tasks=("vqa", "itm"))
    reward = build_reward("unit_tests", resources={"runner": runner}, cache_dir=str(root / "cache"))
    reports = reward.evaluate(
        [p.query for p in pairs] * 2, [p.gold for p in pairs] + [p.mutation.program for p in pairs]
    )
    values = [r.value for r in reports]
    assert None not in values
    gold, wrong = values[: len(pairs)], values[len(pairs) :]
    auc = paired_auc(gold, wrong)
    print(f"unit-test reward, paired AUC over {len(pairs)} pairs: {auc:.3f}; stats {reward.stats}")
    assert len(pairs) == 200 and auc >= 0.85
    assert sum(gold) / len(gold) >= 0.9 and sum(wrong) / len(wrong) <= 0.6


class _ReplyWriter:
    """An LLM-like writer with a canned reply, parsed as the LLM writer's replies are."""

    config_key = "canned/v1"
    sees_program = False

    def __init__(self, reply: str):
        self.reply, self.warnings = reply, Counter()

    def write(self, queries, programs=None):
        return [parse_tests(self.reply, self.warnings) for _ in queries]


def test_unparseable_writer_reply_gives_no_tests_a_counted_warning_and_no_reward(runner, tmp_path):
    config = UnitTestRewardConfig(cache_dir=str(tmp_path))
    reward = UnitTestReward(config, runner, writer=_ReplyWriter("Sorry, I can't write tests for that."))
    (report,) = reward.evaluate(["Is there a red circle?"], ["def execute_command(image):\n    return 'yes'\n"])
    assert report.value is None and report.outcomes == ()
    assert reward.stats["warnings"] == {"unparseable_reply": 1} and reward.stats["programs_without_tests"] == 1


def test_reward_through_the_composer_with_the_runner_as_a_resource(world, runner, tmp_path):
    examples = load_shapes_tasks(world, ["val"])["val"][:3]
    gold = load_gold_programs(world)["vqa"]
    programs = [gold[e.query] for e in examples]
    spec = RewardSpec("unit_tests", 1.0, {"cache_dir": str(tmp_path), "num_tests": 3, "aggregate": "min"})
    with pytest.raises(ValueError, match="needs the live resource 'runner'"):
        RewardComposer(RewardConfig((spec,)))
    composer = RewardComposer(RewardConfig((spec,)), resources={"runner": runner})
    results = runner.run(list(zip(examples, programs)))  # the real images' runs, as the trainer does
    batch = composer(examples, results, programs)
    assert batch.components["unit_tests"] == [1.0, 1.0, 1.0] and batch.totals == [1.0, 1.0, 1.0]
