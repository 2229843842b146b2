"""`python -m vprl.train.evaluation`: bad input fails before any work with a message naming the bad value; the
pipeline writes JSON (round trip), markdown (the matrix) and PNG plots; and the command line runs
end to end on a tiny Llama, as a script (`python vprl/train/evaluation/pipeline.py`, the sys.path fix).

The pipeline test drives `evaluate()` with the scripted policy of tests/evaluate_helpers.py (a
`Generator` test double standing in for two policies of different quality), so its numbers are
known; the command-line test uses a real (random, tiny) transformers model and peft adapter.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from evaluate_helpers import ScriptedPolicy, all_gold, build_tiny_llama, build_world
from PIL import Image

from vprl.train.evaluation.pipeline import EvalConfig, evaluate, main
from vprl.train.evaluation.plan import load_examples
from vprl.train.evaluation.report import markdown, results_from_json

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    build_world(root, val=8)
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, world):
    """(model dir, adapter dir) of a random tiny Llama with 256 positions and a LoRA on it."""
    root = tmp_path_factory.mktemp("tiny")
    model = build_tiny_llama(root / "model", world, context=256, adapter_out=root / "adapter")
    return model, str(root / "adapter")


def _never(policy):
    raise AssertionError("a model was requested although the input is bad")


def _cfg(tmp_path, world, model, **kw):
    base = dict(
        model_name_or_path=model,
        shapes_root=str(world),
        prompt_layout="bare",
        out=str(tmp_path / "out"),
        limit=4,
        max_completion_length=32,
    )
    return EvalConfig(**(base | kw))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"datasets": "shapes:val,gqa_testdev"}, r"unknown dataset 'gqa_testdev'; valid names: shapes:train, .*okvqa"),
        ({"datasets": "shapes:nope"}, r"unknown dataset 'shapes:nope'; valid names: .*shapes:heldout"),
        ({"datasets": "vqav2"}, r"'vqav2' needs its root folder in data_roots"),
        ({"shapes_root": "/no/such/world"}, r"needs shapes_root, a shapes world folder .*'/no/such/world'"),
        ({"tool_stack": "stacks/no_such.yaml"}, r"tool_stack: tool stack stacks/no_such.yaml does not exist"),
        (
            {"tool_stack": "no_such_stack"},
            r"tool_stack: tool stack 'no_such_stack': no file of that name .*named stacks: .*shapes",
        ),
        ({"model_name_or_path": "/no/such/model"}, r"model_name_or_path: /no/such/model does not exist"),
        ({"modes": "single,best_of_n"}, r"unknown inference mode\(s\) \['best_of_n'\]; valid modes: single, majority"),
        ({"modes": "unit_test_select"}, r"need `unit_tests` settings"),
        ({"modes": "self_tuning"}, r"mode self_tuning needs `self_tuning`"),
        ({"modes": "self_tuning", "self_tuning": '{"min_visibility": 0.3}'}, r"unknown setting.*min_visible"),
        ({"modes": "reprompt_tests", "unit_tests": '{"num_test": 3}'}, r"unit_tests: unknown setting.*num_tests"),
        ({"modes": "self_debug", "feedback": "hint"}, r"feedback 'hint' is not one of"),
        ({"prompt_layout": "fancy"}, r"layout: 'fancy' is not one of"),
        ({"seeds": "0,x"}, r"seeds: expected a comma list of integers"),
    ],
)
def test_bad_input_fails_before_any_work(tmp_path, world, tiny, change, message):
    with pytest.raises(ValueError, match=message):  # as the config is read (seeds) or checked
        evaluate(_cfg(tmp_path, world, tiny[0], **change), make_generator=_never)
    assert not (tmp_path / "out").exists()


def test_a_tool_stack_by_name_as_train_rl_takes_it(tmp_path, world, tiny):
    """`tools: shapes` names the packaged stack, as a recipe's `tool_stack` does."""
    from vprl.train.evaluation.plan import check_tools

    check_tools(_cfg(tmp_path, world, tiny[0], tool_stack="shapes"), [])  # no error: the stack was found


def test_adapter_of_another_base_and_too_long_prompts_are_refused(tmp_path, world, tiny):
    model, adapter = tiny
    other = tmp_path / "other_adapter"
    other.mkdir()
    (other / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "codellama/CodeLlama-7b-hf"}))
    with pytest.raises(ValueError, match=r"was trained on base model 'codellama/CodeLlama-7b-hf'.*but the policy is"):
        evaluate(_cfg(tmp_path, world, model, adapters=f"rl={other}"), make_generator=_never)
    with pytest.raises(ValueError, match=r"has no adapter_config.json"):
        evaluate(_cfg(tmp_path, world, model, adapters=str(tmp_path)), make_generator=_never)
    # The adapter made on this very model passes the check (and a relative path names the same folder).
    rel = os.path.relpath(model)
    evaluate(_cfg(tmp_path, world, rel, adapters=f"rl={adapter}", datasets="shapes:val", limit=1, threads=1))
    # The full API listing (~6k tokens) cannot fit a 256-position model: refused before loading it.
    with pytest.raises(ValueError, match=r"needs \d+ positions .* but policy .* has 256; use prompt_layout 'bare'"):
        evaluate(_cfg(tmp_path / "long", world, model, prompt_layout="stanic"))
    assert not (tmp_path / "long").exists()


def test_the_evaluation_gives_the_thread_count_back(tmp_path, world, tiny):
    """`threads` is the evaluation's: the quickstart and the benchmarks train after it in the same
    process, and found their RL on one thread (and its other float sums) after the first evaluation."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        evaluate(_cfg(tmp_path, world, tiny[0], adapters=f"rl={tiny[1]}", datasets="shapes:val", limit=1, threads=1))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_unknown_key_on_the_command_line_or_in_the_yaml(tmp_path, world, tiny, capsys):
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": tiny[0], "shapes_root": str(world), "num_generation": 3}))
    with pytest.raises(SystemExit) as exit_:
        main(["--config", str(path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and re.search(
        r"(?s)unknown key\(s\) \['num_generation'\].*did you mean num_generations", err
    )
    with pytest.raises(SystemExit) as exit_:
        main(["--model_name_or_path", tiny[0], "--shapes_root", str(world), "--datasets", "shapes:va"])
    assert exit_.value.code == 2 and "unknown dataset 'shapes:va'" in capsys.readouterr().err


def test_pipeline_reports_json_markdown_and_plots(tmp_path, world, tiny):
    """Two policies of known quality (scripted), two modes, fallback, two seeds."""
    gold = all_gold(world)
    cfg = _cfg(
        tmp_path,
        world,
        tiny[0],
        adapters=f"after_rl={tiny[1]}",
        base_label="before_rl",
        modes="single,majority",
        num_generations=3,
        fallback=True,
        seeds="0,1",
        limit=6,
    )
    report = evaluate(cfg, make_generator=lambda p: ScriptedPolicy(gold, wrong_share=0.2 if p.adapter else 0.7))
    results, paths = report["results"], report["paths"]
    assert list(results) == ["before_rl", "after_rl"]
    assert list(results["after_rl"]) == ["single", "single+fallback", "majority of 3", "majority of 3+fallback"]
    datasets = ["shapes:val", "shapes:heldout", "shapes:winoground", "shapes:sugarcrepe", "shapes:refcoco"]
    assert list(results["after_rl"]["single"]) == datasets
    assert set(results["after_rl"]["single"]["shapes:val"]) == {0, 1}
    val = {p: results[p]["single"]["shapes:val"][0].headline["accuracy"] for p in results}
    assert val["after_rl"] > val["before_rl"]  # fewer scripted mistakes, better number

    data = json.loads(paths["json"].read_text())
    assert results_from_json(data) == results
    assert data["headline"]["shapes:winoground"] == "group" and data["examples"]["shapes:val"] == 6
    cell = data["matrix"]["after_rl"]["majority of 3"]["shapes:heldout"]
    assert cell["seeds"] == 2 and 0 <= cell["mean"] <= 1

    md = paths["markdown"].read_text()
    assert md == markdown(results, report["modes"]) == markdown(results, data["modes"])
    assert "- **majority of 3+fallback**: the same programs (majority of 3), with the end-to-end tool's" in md
    assert "| policy | shapes:val (accuracy) | shapes:heldout (accuracy) | shapes:winoground (group)" in md
    assert "shapes:sugarcrepe: the cell is category_mean, ours" in md  # not the official script's number
    assert "## single+fallback" in md and "| before_rl | " in md and " ± " in md

    rows = [json.loads(line) for line in paths["predictions"].read_text().splitlines()]
    n_examples = sum(data["examples"].values())
    assert len(rows) == 2 * 2 * 2 * n_examples  # policies × modes × seeds × examples
    assert {"policy", "mode", "dataset", "seed", "example_id", "program", "status"} <= set(rows[0])
    # each row says what was asked, what was right, and whether the answer was (with and without the fallback)
    examples = {e.id: e for name in data["examples"] for e in load_examples(cfg, name)}
    for row in rows:
        example = examples[row["example_id"]]
        assert row["query"] == example.query
        assert row["gold"] == (list(example.box) if example.task == "grounding" else list(example.answers))
        assert row["correct"] == (row["score"] >= 0.5) and row["correct_with_fallback"] == (
            row["score_with_fallback"] >= 0.5
        )
        if row["status"] != "ok":
            assert row["score"] == 0.0 and row["correct"] is False
    val = [r for r in rows if r["dataset"] == "shapes:val" and r["mode"] == "single" and r["seed"] == 0]
    assert {p: sum(r["correct"] for r in val if r["policy"] == p) for p in ("before_rl", "after_rl")} == {
        p: round(6 * results[p]["single"]["shapes:val"][0].variants["normalised_match"])
        for p in ("before_rl", "after_rl")
    }
    assert (tmp_path / "out" / "evaluation.csv").is_file() and (tmp_path / "out" / "per_type.csv").is_file()
    assert "\\caption{Mode majority of 3+fallback:" in (tmp_path / "out" / "evaluation.tex").read_text()

    pngs = sorted(p.name for p in (tmp_path / "out" / "plots").glob("*.png"))
    assert pngs == sorted(
        ["generalization_matrix.png", "errors.png"] + [f"per_type_shapes_{d.split(':')[1]}.png" for d in datasets]
    )
    for name in pngs:
        with Image.open(tmp_path / "out" / "plots" / name) as im:
            assert im.width >= 500 and im.height >= 250, (name, im.size)


def test_command_line_end_to_end_on_a_tiny_llama(tmp_path, world, tiny):
    """`python -m vprl.train.evaluation --config ...` from another directory: the installed package loads
    the base and the adapter, runs the sandboxed executor, and writes every report."""
    model, adapter = tiny
    config = tmp_path / "eval.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model_name_or_path": model,
                "shapes_root": str(world),
                "prompt_layout": "bare",
                "limit": 2,
                "max_completion_length": 12,
                "modes": "single",
                "fallback": True,
                "threads": 1,
                "out": str(tmp_path / "out"),
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "vprl.train.evaluation", "--config", str(config), "--adapters", f"rl={adapter}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "## single+fallback" in proc.stdout and "| rl | " in proc.stdout
    data = json.loads((tmp_path / "out" / "evaluation.json").read_text())
    assert set(data["results"]) == {"base", "rl"}
    assert (tmp_path / "out" / "plots" / "generalization_matrix.png").is_file()


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs" / "eval").glob("*.yaml")))
def test_shipped_configs_parse_and_validate(world, tiny, name):
    from vprl.train.evaluation.pipeline import validate
    from vprl.train.recipe.parsing import parse_config

    argv = [
        "--config",
        str(REPO / "configs" / "eval" / name),
        "--model_name_or_path",
        tiny[0],
        "--shapes_root",
        str(world),
    ]
    gqa = name.startswith("gqa_")  # the GPU configs: the fixture stands in for the official GQA download
    if gqa:
        argv += ["--data_roots", f"gqa={REPO / 'tests/fixtures/datasets/gqa'}", "--generator", "hf"]
    if "seen_from:" in (REPO / "configs" / "eval" / name).read_text():
        argv += ["--seen_from", str(world)]  # the shipped path is the quickstart's world, absent on a fresh clone
    (cfg,) = parse_config([EvalConfig], [*argv, "--adapters", f"after_rl={tiny[1]}"])
    plan = validate(cfg)
    assert [p.label for p in plan.policies][-1] == "after_rl" and plan.datasets[0] == ("gqa" if gqa else "shapes:val")
    if gqa:
        from vprl.train.evaluation.plan import load_examples

        assert load_examples(cfg, "gqa")  # the papers' evaluation sample of the fixture's questions
