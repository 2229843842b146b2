"""Mutations of shapes-world gold programs: they parse, differ from the gold, and are wrong answers."""

import ast
import collections
import json

import pytest

from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
from vprl.data.shapes.mutations import MUTATION_KINDS, Mutation, MutationPair, mutate, mutation_pairs
from vprl.data.shapes.tasks import load_shapes_tasks, scene_graph_files
from vprl.executor.host import ToolHost
from vprl.executor.program import program_key
from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.executor.tools.stack import build_backend

# `[-1]` for `[0]` of a list holding one object (every "the X" phrase is unique) is the same object.
NEVER_WRONG_ON_ORACLE = {"index_swap"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    build_dataset(BuildConfig(out=str(root), train=10, val=60, seed=5, winoground=6, sugarcrepe=2, refcoco=12))
    return root


def test_every_mutant_parses_differs_and_round_trips(world):
    gold = load_gold_programs(world)
    kinds = collections.Counter()
    for programs in gold.values():
        for program in programs.values():
            mutants = mutate(program)
            keys = {program_key(program)} | {program_key(m.program) for m in mutants}
            assert len(keys) == len(mutants) + 1, program
            for m in mutants:
                ast.parse(m.program)
                assert Mutation.from_json(json.loads(json.dumps(m.to_json()))) == m
                kinds[m.kind] += 1
    # the world's templates give every kind something to bite on
    assert set(kinds) == set(MUTATION_KINDS), set(MUTATION_KINDS) - set(kinds)


def test_edits_are_the_intended_ones():
    src = (
        "def execute_command(image):\n    image_patch = ImagePatch(image)\n"
        '    obj = image_patch.find("red circle")[0]\n'
        '    return "left" if obj.horizontal_center < image_patch.horizontal_center else "right"\n'
    )
    by_kind = {m.kind: m.program for m in mutate(src)}
    assert set(by_kind) == {"flip_comparison", "swap_side", "swap_axis", "index_swap", "drop_modifier"}
    assert "obj.horizontal_center > image_patch" in by_kind["flip_comparison"]
    assert 'return "right" if' in by_kind["swap_side"]
    assert "obj.vertical_center < image_patch.vertical_center" in by_kind["swap_axis"]
    assert 'find("circle")[0]' in by_kind["drop_modifier"]
    logic = 'def execute_command(image):\n    return bool_to_yesno(image_patch.exists("a b") and image_patch.exists("c"))\n'
    by_kind = {m.kind: m.program for m in mutate(logic)}
    assert "bool_to_yesno(not (image_patch" in by_kind["invert_answer"]
    assert 'bool(image_patch.find("a b")[0])' in by_kind["unchecked_empty"]
    assert ") or image_patch" in by_kind["swap_logic"]
    with pytest.raises(ValueError, match="does not parse"):
        mutate("def execute_command(image:\n")
    with pytest.raises(ValueError, match="not one of"):
        Mutation("typo", "x")


def test_mutation_pairs_are_seeded_and_json(world):
    a, b = mutation_pairs(world, seed=1, n=30), mutation_pairs(world, seed=1, n=30)
    assert a == b and len(a) == 30 and a != mutation_pairs(world, seed=2, n=30)
    assert all(MutationPair.from_json(json.loads(json.dumps(p.to_json()))) == p for p in a)


def test_mutants_answer_wrong_on_the_oracle(world):
    """Gold is always right on the oracle; each kind (except the benign one) is wrong on some
    examples of its family, and the mutants together are wrong on most of them."""
    tasks = load_shapes_tasks(world, ["val", "heldout"])
    examples = tasks["val"][:40] + tasks["heldout"][:40]
    gold = load_gold_programs(world)["vqa"]
    jobs = [(e, gold[e.query], "gold") for e in examples]
    jobs += [(e, m.program, m.kind) for e in examples for m in mutate(gold[e.query])]
    backend = build_backend({"backend": "oracle", "scene_graphs": [str(p) for p in scene_graph_files(world)]})
    with SyncRunner(ToolHost(backend), RunnerConfig(slots=2)) as runner:
        results = runner.run([(e, p) for e, p, _ in jobs])
    total, wrong = collections.Counter(), collections.Counter()
    for (example, _, kind), result in zip(jobs, results):
        right = result.status == "ok" and str(result.answer) in example.answers
        total[kind] += 1
        wrong[kind] += not right
    rates = {k: wrong[k] / total[k] for k in total}
    print("wrong rate per kind:", {k: f"{wrong[k]}/{total[k]}" for k in sorted(total)})
    assert rates["gold"] == 0.0
    for kind in total:
        if kind != "gold" and kind not in NEVER_WRONG_ON_ORACLE and total[kind] >= 4:
            assert rates[kind] > 0, kind
    mutants = [k for k in total if k != "gold"]
    assert sum(wrong[k] for k in mutants) / sum(total[k] for k in mutants) > 0.4
