"""Every command line treats bad input alike: exit status 2, a first line on stderr that starts with
`error:` and names the place (file and line, key or option), and no traceback.

Each case runs the command's `__main__` in this process (`runpy`, as `python -m` or `python FILE`
would), so a traceback is an exception escaping here. The fixtures are a small shapes world and a
random tiny policy, so that a case fails on its one bad value and nothing else.
"""

from __future__ import annotations

import json
import re
import runpy
import sys
from pathlib import Path

import pytest
import yaml
from evaluate_helpers import build_tiny_llama, build_world

from vprl.data.cli import EXIT_BAD_INPUT
from vprl.data.shapes.tasks import load_shapes_tasks

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Paths of the fixtures and of valid files, each case writes its bad one next to them."""
    root = tmp_path_factory.mktemp("bad_input")
    world = root / "world"
    build_world(world, val=8)
    policy = build_tiny_llama(root / "policy", world, context=256)
    recipe = yaml.safe_load((REPO / "configs/quickstart.yaml").read_text())
    recipe.update(model_name_or_path=policy, dataset_root=str(world), output_dir=str(root / "run"), report_to="none")
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    evaluation = {"model_name_or_path": policy, "shapes_root": str(world), "datasets": ["shapes:val"]}
    evaluation["prompt_layout"] = "bare"
    (root / "eval.yaml").write_text(yaml.safe_dump(evaluation, sort_keys=False))
    example = load_shapes_tasks(world, ["val"])["val"][0].to_json()
    (root / "examples.jsonl").write_text(json.dumps(example) + "\n")
    program = {"id": 1, "example_id": example["id"], "program": "def execute_command(image):\n    return 'yes'\n"}
    (root / "programs.jsonl").write_text(json.dumps(program) + "\n")
    return {"root": root, "world": world, "policy": policy, "example": example, "program": program}


def _write(env, name: str, text: str) -> str:
    path = env["root"] / name
    path.write_text(text)
    return str(path)


def _yaml_with(env, base: str, name: str, **changes) -> str:
    data = yaml.safe_load((env["root"] / base).read_text())
    data.update(changes)
    return _write(env, name, yaml.safe_dump(data, sort_keys=False))


def _jsonl(env, name: str, *rows) -> str:
    return _write(env, name, "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def _exec(env, programs: str, *extra: str, examples: str | None = None, tools="shapes"):
    examples = examples or str(env["root"] / "examples.jsonl")
    out = str(env["root"] / "results.jsonl")
    return [
        "--examples",
        examples,
        "--programs",
        programs,
        "--tool_stack",
        tools,
        "--out",
        out,
        "--executor_sandbox",
        "none",
        *extra,
    ]


def _recipe(env):
    return str(env["root"] / "recipe.yaml")


# #37 item 6: a weight this small once asked for an epoch of 10^8 rows (MemoryError, or OverflowError).
TINY_WEIGHT = {
    "datasets": [
        {"name": "train", "dataset": "shapes", "tasks": ["train"], "weight": 1.0},
        {"name": "val", "dataset": "shapes", "tasks": ["val"], "weight": 1e-7},
    ]
}


def _tiny_weight_recipe(env) -> str:
    data = yaml.safe_load((env["root"] / "recipe.yaml").read_text())
    for key in ("dataset", "dataset_tasks"):  # a mixture names them per entry
        data.pop(key, None)
    return _write(env, "tiny_weight.yaml", yaml.safe_dump({**data, "dataset_mixture": TINY_WEIGHT}, sort_keys=False))


def _eval_adapter(env, name: str, config: str) -> list[str]:
    """The evaluation of one adapter folder holding `config` as its adapter_config.json, no weights."""
    folder = env["root"] / name
    folder.mkdir(exist_ok=True)
    (folder / "adapter_config.json").write_text(config)
    return ["--config", str(env["root"] / "eval.yaml"), "--adapters", f"rl={folder}", "--max_completion_length", "32"]


TRANSFER = "bench/transfer.py"


def _transfer(env, *argv: str) -> list[str]:
    """bench/transfer.py's arguments with one bad value, writing to a folder that must not appear."""
    return ["--seeds", "0", "--out", str(env["root"] / "transfer_out"), *argv]


def _broken_runs_record(env) -> str:
    out = env["root"] / "transfer_runs"
    out.mkdir(exist_ok=True)
    (out / "runs.jsonl").write_text("{seed: 0\n")
    return str(out)


# (case id, command: a module for `python -m` or a script path, argv built from the fixtures, a regex
# the first line of stderr must match: the place of the bad value)
CASES = [
    # vprl/train/rl.py
    ("rl-missing-config", "vprl/train/rl.py", lambda e: ["--config", "no/such.yaml"], r"no/such\.yaml does not exist"),
    (
        "rl-bad-yaml",
        "vprl/train/rl.py",
        lambda e: ["--config", _write(e, "bad.yaml", "a: [1,\n")],
        r"bad\.yaml: not valid YAML",
    ),
    (
        "rl-yaml-wrong-type",
        "vprl/train/rl.py",
        lambda e: ["--config", _yaml_with(e, "recipe.yaml", "eight.yaml", num_generations="eight")],
        r"eight\.yaml:\d+: num_generations: invalid int value: 'eight'",
    ),
    (
        "rl-cli-wrong-type",
        "vprl/train/rl.py",
        lambda e: ["--config", _recipe(e), "--num_generations", "eight"],
        r"command line: --num_generations: invalid int value",
    ),
    (
        "rl-indivisible-group",
        "vprl/train/rl.py",
        lambda e: ["--config", _recipe(e), "--num_generations", "7"],
        r"recipe\.yaml \+ command line: .*divisible by num_generations \(7\)",
    ),
    (
        "rl-yaml-unknown-key",
        "vprl/train/rl.py",
        lambda e: ["--config", _yaml_with(e, "recipe.yaml", "typo.yaml", learning_rat=0.1)],
        r"typo\.yaml: unknown key\(s\) \['learning_rat'\]",
    ),
    (
        "rl-cli-unknown-key",
        "vprl/train/rl.py",
        lambda e: [f"--config={_recipe(e)}", "--lerning_rate", "0.1"],
        r"command line: unknown key\(s\) \['lerning_rate'\]",
    ),
    (
        "rl-algorithm",
        "vprl/train/rl.py",
        lambda e: ["--config", _recipe(e), "--algorithm", "ppo"],
        r"algorithm: 'ppo'",
    ),
    (
        "rl-reward",
        "vprl/train/rl.py",
        lambda e: ["--config", _recipe(e), "--rewards", "[accuracy]"],
        r"rewards.*accuracy",
    ),
    (
        "rl-tool-stack",
        "vprl/train/rl.py",
        lambda e: ["--config", _recipe(e), "--tool_stack", "stacks/none.yaml"],
        r"tool_stack: .*none\.yaml does not exist",
    ),
    (
        "rl-tool-setting-type",
        "vprl/train/rl.py",
        lambda e: ["--config", _recipe(e), "--tool_overrides", "{min_visible: high}"],
        r"min_visible: expected a number",
    ),
    (
        "rl-prompt-layout",
        "vprl/train/rl.py",
        lambda e: ["--config", _recipe(e), "--prompt_layout", "fancy"],
        r"layout.*'fancy'",
    ),
    (
        "rl-dataset-root",
        "vprl/train/rl.py",
        lambda e: ["--config", _recipe(e), "--dataset_root", "/no/such/world"],
        r"dataset_root.*/no/such/world",
    ),
    (
        "rl-mixture-tiny-weight",
        "vprl/train/rl.py",
        lambda e: ["--config", _tiny_weight_recipe(e)],
        r"dataset_mixture\.datasets\[1\] \(val\)\.weight: 1e-07 ",
    ),
    # bench/transfer.py (#37 item 6): each refused before a folder is made, --rl_args before the bootstrap
    *[
        (f"transfer-{name}", TRANSFER, lambda e, argv=argv: _transfer(e, *argv), place)
        for name, argv, place in (
            ("seeds", ["--seeds", "a,b"], r"--seeds: expected a comma list of integers, got 'a,b'"),
            ("max-steps", ["--max_steps", "0"], r"--max_steps.*must be >= 1, got 0"),
            ("threads", ["--threads", "0"], r"--threads: .*0"),
            ("jobs", ["--jobs", "x"], r"--jobs: expected an integer, got 'x'"),
            ("eval-world-json", ["--eval_world", "{val: 4}"], r"--eval_world: not valid JSON"),
            ("eval-world-type", ["--eval_world", "[1]"], r"--eval_world: expected a JSON object"),
            ("eval-world-key", ["--eval_world", '{"vall": 4}'], r"--eval_world: unknown key\(s\) \['vall'\]"),
            (
                "rl-args",
                ["--rl_args", "--lerning_rate 0.1"],
                r"--rl_args: command line: unknown key\(s\) \['lerning_rate'\]",
            ),
            ("rl-args-quote", ["--rl_args", "--run_name 'x"], r"--rl_args: .*No closing quotation"),
            ("arm-args", ["--arm_args", "vqa=--max_steps many"], r"--arm_args vqa=\.\.\.: command line: --max_steps"),
            ("bootstrap", ["--bootstrap", "--bogus 1"], r"--bootstrap: command line: unknown key\(s\) \['bogus'\]"),
            ("eval-args", ["--eval_args", "--limit many"], r"--eval_args: command line: --limit: invalid int value"),
            ("arms", ["--arms", "vqa,nope"], r"--arms: unknown \['nope'\]"),
        )
    ],
    (
        "transfer-out-is-a-file",
        TRANSFER,
        lambda e: _transfer(e, "--out", _write(e, "a_file", "")),
        r"--out: .*a_file exists and is not a folder",
    ),
    (
        "transfer-out-under-a-file",
        TRANSFER,
        lambda e: _transfer(e, "--out", _write(e, "a_file", "") + "/sub"),
        r"--out: .*a_file/sub cannot be made: .*a_file is not a writable folder",
    ),
    (
        "transfer-runs-record",
        TRANSFER,
        lambda e: _transfer(e, "--out", _broken_runs_record(e)),
        r"runs\.jsonl:1: not valid JSON",
    ),
    # the recipe's other commands
    (
        "recipe-unknown-key",
        "vprl.train.recipe",
        lambda e: ["output_dir", "--", "--config", _recipe(e), "--bogus", "1"],
        r"command line: unknown key\(s\) \['bogus'\]",
    ),
    ("recipe-no-separator", "vprl.train.recipe", lambda e: ["output_dir"], r"train\.recipe: .*follow `--`"),
    (
        "prepare-unit-tests-without-reward",
        "vprl.train.prepare_unit_tests",
        lambda e: ["--config", _recipe(e)],
        r"rewards: the recipe has no unit_tests reward",
    ),
    (
        "verl-data-unknown-key",
        "vprl.train.integrations.verl_data",
        lambda e: ["--config", _recipe(e), "--bogus", "1"],
        r"command line: unknown key\(s\) \['bogus'\]",
    ),
    # vprl.train.evaluation
    (
        "eval-dataset",
        "vprl.train.evaluation",
        lambda e: ["--config", str(e["root"] / "eval.yaml"), "--datasets", "shapes:nope"],
        r"datasets: unknown dataset 'shapes:nope'",
    ),
    (
        "eval-seeds",
        "vprl.train.evaluation",
        lambda e: ["--config", str(e["root"] / "eval.yaml"), "--seeds", "one,two"],
        r"seeds: expected .*integers",
    ),
    (
        "eval-policy",
        "vprl.train.evaluation",
        lambda e: ["--config", str(e["root"] / "eval.yaml"), "--model_name_or_path", "/no/such/model"],
        r"model_name_or_path: /no/such/model does not exist",
    ),
    (
        "eval-retired-name",
        "vprl.train.evaluation",
        lambda e: ["--config", str(e["root"] / "eval.yaml"), "--policy", "/no/such/model"],
        r"^error: command line: policy is now model_name_or_path \(one name per setting",
    ),
    (
        "eval-settings-not-a-mapping",
        "vprl.train.evaluation",
        lambda e: ["--config", _yaml_with(e, "eval.yaml", "eval_tests.yaml", unit_tests=[1, 2])],
        r"eval_tests\.yaml: unit_tests: expected a dict",
    ),
    (
        "eval-mode",
        "vprl.train.evaluation",
        lambda e: ["--config", str(e["root"] / "eval.yaml"), "--modes", "best"],
        r"modes: unknown inference mode\(s\) \['best'\]",
    ),
    (
        "eval-yaml-wrong-type",
        "vprl.train.evaluation",
        lambda e: ["--config", _yaml_with(e, "eval.yaml", "eval_limit.yaml", limit="many")],
        r"eval_limit\.yaml:\d+: limit: invalid int value: 'many'",
    ),
    (
        "eval-adapter-without-weights",
        "vprl.train.evaluation",
        lambda e: [*_eval_adapter(e, "no_weights", json.dumps({"base_model_name_or_path": e["policy"]}))],
        r"adapters: .*no_weights' has no adapter_model\.safetensors",
    ),
    (
        "eval-adapter-config-corrupt",
        "vprl.train.evaluation",
        lambda e: [*_eval_adapter(e, "corrupt_config", '{"r": 16,')],
        r"adapters: .*corrupt_config/adapter_config\.json:1: not valid JSON",
    ),
    # vprl.train.quickstart, vprl.train.bootstrap
    ("quickstart-wrong-type", "vprl.train.quickstart", lambda e: ["--max_steps", "abc"], r"command line: --max_steps"),
    ("bootstrap-range", "vprl.train.bootstrap", lambda e: ["--weak_share", "2"], r"weak_share must be in \[0, 1\]"),
    # vprl.train.ace
    (
        "ace-no-rollouts",
        "vprl.train.ace",
        lambda e: ["from-run", "--run", str(e["root"]), "--out", str(e["root"] / "aces.jsonl")],
        r"rollouts\.jsonl: no rollouts log",
    ),
    (
        "ace-k",
        "vprl.train.ace",
        lambda e: ["from-run", "--run", str(e["root"]), "--k", "0", "--out", str(e["root"] / "aces.jsonl")],
        r"--k: must be >= 1, got 0",
    ),
    (
        "ace-stanic-recipe",
        "vprl.train.ace",
        lambda e: ["stanic", "--config", _recipe(e)],
        r"recipe\.yaml: unknown key\(s\) \['algorithm'",
    ),
    (
        "ace-subcommand",
        "vprl.train.ace",
        lambda e: ["mine"],
        r"train\.ace: argument \{from-run,stanic\}: invalid choice: 'mine'",
    ),
    # vprl.train.export
    (
        "export-no-run",
        "vprl.train.export",
        lambda e: ["--run", "/no/such/run", "--out", str(e["root"] / "export")],
        r"/no/such/run",
    ),
    # vprl.executor.run
    (
        "exec-not-json",
        "vprl.executor.run",
        lambda e: _exec(e, _jsonl(e, "p_json.jsonl", "{id: 1")),
        r"p_json\.jsonl:1: not valid JSON",
    ),
    (
        "exec-no-program",
        "vprl.executor.run",
        lambda e: _exec(e, _jsonl(e, "p_missing.jsonl", {"id": 1, "example_id": e["example"]["id"]})),
        r"p_missing\.jsonl:1: missing key\(s\) \['program'\]",
    ),
    (
        "exec-program-type",
        "vprl.executor.run",
        lambda e: _exec(e, _jsonl(e, "p_type.jsonl", {**e["program"], "program": 5})),
        r"p_type\.jsonl:1: program: expected a string, got int",
    ),
    (
        "exec-unknown-example",
        "vprl.executor.run",
        lambda e: _exec(e, _jsonl(e, "p_ex.jsonl", e["program"], {**e["program"], "id": 2, "example_id": "nope"})),
        r"p_ex\.jsonl:2: example_id 'nope' is not in the examples file",
    ),
    (
        "exec-missing-programs",
        "vprl.executor.run",
        lambda e: _exec(e, str(e["root"] / "none.jsonl")),
        r"none\.jsonl",
    ),
    (
        "exec-missing-stack",
        "vprl.executor.run",
        lambda e: _exec(e, str(e["root"] / "programs.jsonl"), tools="stacks/none.yaml"),
        r"tool stack stacks/none\.yaml does not exist",
    ),
    (
        "exec-oracle-without-scene-graphs",
        "vprl.executor.run",
        lambda e: _exec(e, str(e["root"] / "programs.jsonl"), tools="oracle"),
        r"oracle(\.yaml)?: the oracle backend needs `scene_graphs:`",
    ),
    (
        "exec-answers-not-a-list",
        "vprl.executor.run",
        lambda e: _exec(
            e,
            str(e["root"] / "programs.jsonl"),
            examples=_jsonl(e, "ex_answers.jsonl", {**e["example"], "answers": "yes"}),
        ),
        r"ex_answers\.jsonl:1: answers: expected a list of strings, got str 'yes'",
    ),
    (
        "exec-retired-option",
        "vprl.executor.run",
        lambda e: _exec(e, str(e["root"] / "programs.jsonl"), "--slots", "2"),
        r"executor\.run: --slots is now --executor_slots \(one name per setting",
    ),
    (
        "exec-bad-option",
        "vprl.executor.run",
        lambda e: ["--examples"],
        r"executor\.run: argument --examples: expected",
    ),
    # vprl.data.shapes, vprl.executor.serve
    ("shapes-negative", "vprl.data.shapes", lambda e: ["--out", str(e["root"] / "w"), "--val", "-3"], r"val"),
    (
        "shapes-no-out",
        "vprl.data.shapes",
        lambda e: ["--val", "3"],
        r"data\.shapes: the following arguments are required",
    ),
    (
        "serve-missing-stack",
        "vprl.executor.serve",
        lambda e: ["--tool_stack", "stacks/none.yaml"],
        r"tool stack stacks/none\.yaml does not exist",
    ),
]


def run_main(command: str, argv: list[str], monkeypatch) -> int:
    """Run a command's `__main__` as the shell would; its exit status (0 when it returns)."""
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", [command, *argv])
    try:
        if command.endswith(".py"):
            runpy.run_path(str(REPO / command), run_name="__main__")
        else:
            runpy.run_module(command, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


# runpy notes that the module ran before as an import (by an earlier case); harmless here
@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import:RuntimeWarning")
@pytest.mark.parametrize(("command", "make_argv", "place"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_naming_the_place(env, command, make_argv, place, monkeypatch, capsys):
    status = run_main(command, make_argv(env), monkeypatch)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == EXIT_BAD_INPUT, err
    assert "Traceback" not in err
    assert lines and lines[0].startswith("error: "), err
    assert re.search(place, lines[0]), f"{place!r} not in {lines[0]!r}"


@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import:RuntimeWarning")
def test_item6_bad_transfer_input_leaves_no_folder(env, monkeypatch, capsys):
    out = env["root"] / "transfer_out"
    for name, command, make_argv, _ in CASES:
        if command == TRANSFER and "out" not in name:
            assert run_main(command, make_argv(env), monkeypatch) == EXIT_BAD_INPUT, name
            assert not out.exists(), f"{name} left {out} behind"


def test_there_are_at_least_thirty_cases_over_every_command():
    assert len(CASES) >= 30
    commands = {c[1] for c in CASES}
    assert commands >= {
        "vprl/train/rl.py",
        "vprl.train.recipe",
        "vprl.train.prepare_unit_tests",
        "vprl.train.evaluation",
        "vprl.train.quickstart",
        "vprl.train.bootstrap",
        "vprl.train.ace",
        "vprl.train.export",
        "vprl.executor.run",
        "vprl.data.shapes",
        "vprl.executor.serve",
        "vprl.train.integrations.verl_data",
    }
