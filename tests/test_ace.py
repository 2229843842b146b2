"""ACE mining: from a shapes-world run's rollouts (gold and mutated programs scored by the oracle tools)
and by Stanić et al.'s zero-shot procedure; the ACE file feeds the prompt builder."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
from vprl.data.shapes.mutations import mutate
from vprl.data.shapes.tasks import load_shapes_tasks
from vprl.executor.host import ToolHost
from vprl.executor.program import program_key
from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.executor.tools.stack import build_backend
from vprl.rewards.compose import RewardComposer, RewardConfig
from vprl.train.ace.__main__ import main
from vprl.train.ace.from_run import aces_from_run, best_per_example
from vprl.train.ace.records import Ace, AceError, select_diverse
from vprl.train.ace.stanic import stanic_aces
from vprl.train.prompts import PromptConfig, PromptTemplate, load_examples, read_examples
from vprl.train.rollouts.log import RolloutLog, RolloutRow
from vprl.train.rollouts.scorer import ProgramScorer
from vprl.train.runs.folder import write_manifest

TOOL_STACK = {"file": "oracle", "config": {"backend": "oracle", "min_visible": 0.5}}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    build_dataset(BuildConfig(out=str(root), train=30, val=4, seed=3))
    examples = load_shapes_tasks(root, ["train"])["train"]
    return root, examples, load_gold_programs(root)["vqa"]


@pytest.fixture(scope="module")
def scorer(world):
    root = world[0]
    backend = build_backend({"backend": "oracle", "scene_graphs": str(root / "gqa" / "train_sceneGraphs.json")})
    with SyncRunner(ToolHost(backend), RunnerConfig(slots=2)) as runner:
        yield ProgramScorer(runner, RewardComposer(RewardConfig()))


def _reformatted(program: str) -> str:
    """The same AST written differently (a comment, blank lines): the latest-step tie-break's subject."""
    return program.replace("\n    ", "\n    # mined again\n\n    ", 1)


@pytest.fixture(scope="module")
def run(world, scorer, tmp_path_factory):
    """A run folder whose rollouts hold mutants (step 1), gold programs (step 2) and, at step 3,
    reformatted gold for the first examples and second mutants for the next ones."""
    _, examples, gold = world
    run = tmp_path_factory.mktemp("run")
    write_manifest(run, {"policy": {"base_model": "tiny", "name": "tiny-policy"}, "tool_stack": TOOL_STACK})
    log = RolloutLog.in_run(run)
    steps = {
        1: [(ex, mutate(gold[ex.query])[0].program) for ex in examples],
        2: [(ex, gold[ex.query]) for ex in examples],
        3: [(ex, _reformatted(gold[ex.query])) for ex in examples[:5]]
        + [(ex, (mutate(gold[ex.query])[1:] or mutate(gold[ex.query]))[0].program) for ex in examples[5:10]],
    }
    for step, pairs in steps.items():
        exs, programs = [p[0] for p in pairs], [p[1] for p in pairs]
        log.append(scorer.score(exs, programs).rows(step, exs, programs, "prompthash", policy="tiny-policy"))
    masked = RolloutRow(step=3, example_id=examples[0].id, prompt_hash="h", program="x", status="infra_error")
    log.append([masked])
    return run


def _rescore(scorer, examples, aces):
    by_id = {ex.id: ex for ex in examples}
    exs = [by_id[a.extra["example_id"]] for a in aces]
    assert [ex.query for ex in exs] == [a.query for a in aces]
    return scorer.score(exs, [a.program for a in aces])


def test_aces_from_a_run_are_correct_distinct_and_cover_the_families(world, scorer, run, tmp_path, capsys):
    _, examples, _ = world
    families = {ex.group for ex in examples}
    k = len(families) + 3
    out = tmp_path / "aces.jsonl"
    assert main(["from-run", "--run", str(run), "--k", str(k), "--out", str(out)]) == 0
    aces = read_examples(out)
    assert len(aces) == k
    # every program is right on its own question with perfect perception
    assert _rescore(scorer, examples, aces).rewards.totals == [1.0] * k
    assert len({program_key(a.program) for a in aces}) == k
    assert {a.extra["group"] for a in aces} == families  # the run had a good program for every family
    assert {a.extra["group"] for a in aces[: len(families)]} == families  # coverage comes first
    first = aces[0].extra
    assert first["policy"] == "tiny-policy" and first["tool_stack"] == TOOL_STACK
    assert first["components"] == {"correctness": 1.0} and first["score"] == 1.0 and first["step"] in (2, 3)
    preview = (tmp_path / "aces.md").read_text()
    assert f"# {k} ACEs (from-run" in preview and aces[0].program.strip() in preview
    assert "ACEs" in capsys.readouterr().out

    # the ACE file is an in-context example file: it loads and lands in the prompt
    prompt = PromptTemplate.from_config(PromptConfig(ice_file=str(out), max_ices=3)).build("How many circles?")
    assert aces[0].program.strip() in prompt and f"# {aces[2].query}" in prompt
    assert load_examples(out).examples[0].extra["example_id"] == first["example_id"]


def test_best_program_per_example_prefers_reward_then_latest_step(world, run):
    _, examples, gold = world
    candidates, counts = best_per_example(RolloutLog.in_run(run).read(), "run")
    by_id = {c.example_id: c for c in candidates}
    assert counts["masked"] == 1 and len(by_id) == len(examples)
    for ex in examples[:5]:  # gold at step 2 and its reformatted twin at step 3: the latest wins
        assert by_id[ex.id].step == 3 and "# mined again" in by_id[ex.id].program
    for ex in examples[5:10]:  # a wrong mutant at step 3 never beats the step-2 gold
        assert by_id[ex.id].score == 1.0
        if by_id[ex.id].step == 3:  # unless the mutant happens to be right on this image
            assert by_id[ex.id].program != gold[ex.query]


def test_k_beyond_the_good_programs_writes_what_there_is(run, tmp_path, capsys):
    out = tmp_path / "aces.jsonl"
    assert main(["from-run", "--run", str(run), "--k", "500", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    written = len(read_examples(out))
    assert f"asked for 500 ACEs but only {written} distinct programs" in err
    assert "asked for 500" in (tmp_path / "aces.md").read_text()
    assert written == aces_from_run(run, 500).counts["distinct"]


def test_missing_empty_or_all_bad_logs_are_clear_errors(tmp_path, capsys):
    out = tmp_path / "aces.jsonl"
    with pytest.raises(SystemExit) as exit_:  # bad input: exit status 2, like every command's
        main(["from-run", "--run", str(tmp_path), "--k", "4", "--out", str(out)])
    assert exit_.value.code == 2 and "no rollouts log" in capsys.readouterr().err and not out.exists()
    (tmp_path / "rollouts.jsonl").write_text("")
    with pytest.raises(SystemExit) as exit_:
        main(["from-run", "--run", str(tmp_path), "--k", "4", "--out", str(out)])
    assert exit_.value.code == 2 and "rollouts log is empty" in capsys.readouterr().err and not out.exists()
    bad = [
        RolloutRow(step=1, example_id="e1", prompt_hash="h", program="def execute_command(image):\n    return 1/0\n",
                   status="runtime_error", total=-0.5, query="q1"),
        RolloutRow(step=1, example_id="e2", prompt_hash="h", program="def execute_command(image):\n    return 'x'\n",
                   status="ok", total=0.0, query="q2"),
    ]  # fmt: skip
    RolloutLog.in_run(tmp_path).append(bad)
    with pytest.raises(AceError, match=r"none of its 2 programs ran and earned a positive reward"):
        aces_from_run(tmp_path, 4)
    assert not out.exists()


def _ace(query, group, answer, program_tail):
    program = f"def execute_command(image):\n    return {program_tail}\n"
    return Ace(query, program, f"id-{query}", 1.0, group=group, answer=answer, program_key=program_key(program))


def test_diverse_selection_order_families_then_answers_then_farthest():
    pool = [
        _ace("is the circle red", "verify", "yes", "'yes'"),
        _ace("is the square red", "verify", "yes", "'yes' if 1 else 'no'"),
        _ace("is the square blue", "verify", "no", "'no'"),
        _ace("what color is the circle", "query_color", "red", "'red'"),
        _ace("what color is the square", "query_color", "red", "'red' + ''"),
        _ace("how many hexagons are left of the big purple triangle", "count", "2", "str(len([1, 2]))"),
    ]
    picked = select_diverse(pool, 4)
    assert [a.query for a in picked[:3]] == ["is the circle red", "what color is the circle", pool[5].query]
    assert picked[3].query == "is the square blue"  # the one unseen answer
    # with no families and one answer, farthest-first takes the outlier after the seed
    flat = [Ace(a.query, a.program, a.example_id, 1.0, answer="same") for a in pool]

    def embed(texts):
        return np.array([[10.0 if "hexagons" in t else 0.0, float(i) * 0.01] for i, t in enumerate(texts)])

    assert [a.query for a in select_diverse(flat, 2, embed)] == [pool[0].query, pool[5].query]
    assert select_diverse(pool, 0) == [] and len(select_diverse(pool, 99)) == len(pool)


class ScriptedPolicy:
    """Writes the gold program, a crashing one (fixed once shown its error), or a wrong answer."""

    def __init__(self, gold, crash, wrong):
        self.gold, self.crash, self.wrong = gold, crash, wrong
        self.calls: list[list[str]] = []

    def generate(self, prompts, sampling):
        self.calls.append(list(prompts))
        out = []
        for prompt in prompts:
            query = re.findall(r"^# (.+)$", prompt, flags=re.M)[-1]
            if query in self.wrong:
                out.append(["def execute_command(image):\n    return 'not-an-answer'\n"])
            elif query in self.crash and "ZeroDivisionError" not in prompt:
                out.append(["def execute_command(image):\n    return str(1/0)\n"])
            else:
                out.append([self.gold[query]])
        return out


def test_stanic_procedure_scores_sorts_and_self_debugs(world, scorer, tmp_path):
    _, examples, gold = world
    seen, labelled = set(), []
    for ex in examples:  # distinct queries, so every solved example can become an ACE
        if ex.query not in seen:
            seen.add(ex.query)
            labelled.append(ex)
    labelled = labelled[:12]
    crash = {ex.query for ex in labelled[4:8]}
    wrong = {ex.query for ex in labelled[8:]}
    template = PromptTemplate.from_config(PromptConfig())
    policy = ScriptedPolicy(gold, crash, wrong)
    log = RolloutLog(tmp_path / "attempts.jsonl")
    report = stanic_aces(labelled, policy, scorer, template, k=6, trials=3, policy="scripted", log=log)
    assert [len(c) for c in policy.calls] == [12, 4]  # only the crashes are retried; wrong answers are not
    assert all("An earlier attempt" in p and "ZeroDivisionError" in p for p in policy.calls[1])
    assert report.counts["good"] == 8 and report.counts["solved_by_retry"] == 4
    assert [a.example_id for a in report.aces] == [ex.id for ex in labelled[:6]]  # ties keep the set's order
    assert [a.step for a in report.aces] == [0, 0, 0, 0, 1, 1]
    assert len(log.read()) == 16
    out, preview = tmp_path / "stanic.jsonl", tmp_path / "stanic.md"
    from vprl.train.ace.output import write_aces

    write_aces(report, out)
    aces = read_examples(out)
    assert _rescore(scorer, examples, aces).rewards.totals == [1.0] * 6
    assert aces[0].extra["source"] == "stanic:scripted" and preview.is_file()

    zero_shot = stanic_aces(labelled, ScriptedPolicy(gold, crash, wrong), scorer, template, k=6, trials=1)
    assert len(zero_shot.aces) == 4 and "only 4 distinct programs" in zero_shot.shortfall


def test_stanic_cli_runs_a_hf_policy(world, tmp_path, capsys):
    """The command end to end with a tiny random policy: it writes noise, so nothing scores and the
    command says so; every attempt is logged next to the output."""
    from vprl.train.policy.tiny import TinyModelConfig, build_model, train_tokenizer

    root, examples, gold = world
    # Trained on the prompt text too, so that prompts are short in tokens and the test stays fast.
    corpus = [*gold.values(), PromptTemplate.from_config(PromptConfig()).static] * 2
    tokenizer = train_tokenizer(corpus, vocab_size=1024, context=4096)
    small = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, context=4096)
    build_model(tokenizer, small).save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    ids = [ex.id for ex in examples[:3]]
    config = tmp_path / "stanic.yaml"
    config.write_text(
        json.dumps(
            {
                "model_name_or_path": str(tmp_path / "policy"),
                "dataset": "shapes",
                "dataset_root": str(root),
                "tool_stack": "oracle",
                "executor_slots": 2,
                "ids": ids,
                "max_completion_length": 8,
                "trials": 2,
            }
        )
    )
    out = tmp_path / "aces.jsonl"
    code = main(["stanic", "--config", str(config), "--k", "2", "--out", str(out)])
    assert code == 1 and "no ACE to write" in capsys.readouterr().err and not out.exists()
    attempts = RolloutLog(tmp_path / "aces.attempts.jsonl").read()
    assert {r.example_id for r in attempts} == set(ids) and {r.step for r in attempts} <= {0, 1}
    assert all(r.policy == "policy" for r in attempts)


SHAPE_NAMES = ("circle", "square", "triangle", "star", "hexagon")
COLOR_NAMES = ("red", "blue", "green", "yellow", "orange", "purple", "magenta", "cyan")


def _looking_elsewhere(query: str) -> list[str]:
    """Programs that answer `query` from the wrong object (the quickstart's ACEs had such programs:
    a cyan-circle question answered from `exists("purple circle")`)."""
    head = "def execute_command(image):\n    image_patch = ImagePatch(image)\n"
    if m := re.fullmatch(r"What color is the (.+)\?", query):
        return [
            head + f'    return image_patch.find("{s}")[0].simple_query("What color is the {s}?")\n'
            for s in SHAPE_NAMES
            if s not in m.group(1)
        ]
    if m := re.fullmatch(r"How many (.+) are there\?", query):
        return [
            head + f'    return str(len(image_patch.find("{c} {s}")))\n'
            for c in COLOR_NAMES
            for s in SHAPE_NAMES
            if f"{c} {s}" not in m.group(1)
        ]
    return []


def test_from_run_drops_programs_right_for_the_wrong_reason(world, tmp_path):
    """#29 item 4: ACEs must be right for the right reason. Candidates run on their visual unit tests;
    those right by accident fail them and are dropped, the gold programs pass."""
    root, examples, gold = world
    with SyncRunner(ToolHost(build_backend({"backend": "shapes"})), RunnerConfig(slots=2)) as runner:
        scorer = ProgramScorer(runner, RewardComposer(RewardConfig()))
        elsewhere = [(ex, p) for ex in examples for p in _looking_elsewhere(ex.query)]
        rows = scorer.score([e for e, _ in elsewhere], [p for _, p in elsewhere]).rows(
            1, [e for e, _ in elsewhere], [p for _, p in elsewhere], "h"
        )
        accidental_rows = [r for r in rows if r.total and r.total > 0]
        taken = {r.example_id for r in accidental_rows}  # one kind of program per example
        right = [(ex, gold[ex.query]) for ex in examples if ex.id not in taken][:10]
        gold_rows = scorer.score([e for e, _ in right], [p for _, p in right]).rows(
            1, [e for e, _ in right], [p for _, p in right], "h"
        )
    assert len({r.example_id for r in accidental_rows}) >= 3, "too few programs right by accident in this world"
    run = tmp_path / "run"
    write_manifest(
        run,
        {
            "policy": {"name": "tiny"},
            "tool_stack": {"file": "shapes", "config": {"backend": "shapes"}},
            "dataset": {"dataset": "shapes"},
            "executor": {"slots": 2, "sandbox": "full"},
        },
    )
    RolloutLog.in_run(run).append(gold_rows + accidental_rows)

    unchecked = aces_from_run(run, k=100, unit_tests="none")
    offered = {r.program for r in accidental_rows} & {a.program for a in unchecked.aces}
    assert offered and any("may be right by accident" in n for n in unchecked.notes)
    checked = aces_from_run(run, k=100)
    kept = {a.program for a in checked.aces}
    golds = {p for _, p in right}
    assert len(kept & golds) / len(golds) >= 0.8  # right programs pass their tests ...
    assert len(kept & offered) / len(offered) <= 0.25  # ... programs looking elsewhere fail them
    rejected = checked.counts["rejected_wrong_reason"]
    assert rejected >= len(offered - kept) and any(f"rejected {rejected} of" in n for n in checked.notes)
