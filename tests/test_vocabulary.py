"""#36 item 2: one name per setting in every command. No shipped config, document or example uses a
retired name, and each command that takes a setting refuses its old name in one line naming the new."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vprl.data.retired_names import RETIRED, retired_message
from vprl.train.recipe.parsing import ConfigError, parse_config

REPO = Path(__file__).resolve().parents[1]
YAMLS = sorted((REPO / "configs").rglob("*.yaml"))
# docs/configs.md is left out: its table of retired names is where they must appear.
DOCS = [p for p in sorted((REPO / "docs").glob("*.md")) if p.name != "configs.md"]
TEXTS = [REPO / "README.md", *DOCS, *sorted((REPO / "examples").glob("*.py"))]
TEXTS += [*sorted((REPO / "vprl/train/launch").iterdir()), REPO / "Makefile", *YAMLS]
# Flags of the project's own benchmark scripts, which keep their names (they are not settings of a
# vprl command): `bench/learning.py --variant`, `bench/gpu/acceptance.py --sandbox`.
BENCH_FLAGS = {("docs/benchmarks.md", "--variant"), ("docs/benchmarks.md", "--sandbox")}
OLD = "|".join(n.replace("_", "[_-]") for n in RETIRED)
FLAG = re.compile(rf"(?<![\w-])--({OLD})(?![\w-])")


def test_no_shipped_config_has_a_retired_top_level_key():
    found = [
        f"{path.relative_to(REPO)}: {key}"
        for path in YAMLS
        for key in (yaml.safe_load(path.read_text(encoding="utf-8")) or {})
        if key in RETIRED
    ]
    assert found == []


def test_no_document_example_or_script_gives_a_retired_option():
    found = []
    for path in TEXTS:
        rel = str(path.relative_to(REPO))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [
                f"{rel}:{number}: {m.group(0)}" for m in FLAG.finditer(line) if (rel, m.group(0)) not in BENCH_FLAGS
            ]
    assert found == []


@pytest.mark.parametrize("old", sorted(RETIRED))
def test_a_retired_name_names_its_replacement(old):
    assert (
        retired_message(old) == f"{old} is now {RETIRED[old]} (one name per setting in every command: docs/configs.md)"
    )
    assert retired_message(f"--{old.replace('_', '-')}=1").startswith(f"--{old} is now --{RETIRED[old]}")
    assert retired_message(old, known={"something_else"}) is None  # a command without the setting: unknown key


def test_the_recipe_and_the_evaluation_refuse_old_names_where_they_were_written(tmp_path):
    from vprl.train.evaluation.config import EvalConfig
    from vprl.train.recipe.rl_config import parse_rl_config

    recipe = tmp_path / "rest.yaml"
    recipe.write_text(f"algorithm: rest\noutput_dir: {tmp_path / 'run'}\nrest_samples_per_query: 4\n")
    with pytest.raises(ConfigError, match=r"rest\.yaml:3: rest_samples_per_query is now num_generations"):
        parse_rl_config(["--config", str(recipe)])
    with pytest.raises(ConfigError, match=r"^command line: rest_max_new_tokens is now max_completion_length"):
        parse_rl_config(["--algorithm", "rest", "--output_dir", "x", "--rest_max_new_tokens", "9"])
    with pytest.raises(ConfigError, match=r"^command line: tools is now tool_stack"):
        parse_config([EvalConfig], ["--tools", "shapes"])


def test_the_commands_share_the_sections_and_parse_them_once(tmp_path):
    from vprl.executor.settings import ExecutorArgs
    from vprl.train.bootstrap.fit import BootstrapConfig
    from vprl.train.evaluation.config import EvalConfig
    from vprl.train.recipe.rl_config import parse_rl_config
    from vprl.train.recipe.sections import ModelArgs, SamplingArgs

    assert issubclass(EvalConfig, ExecutorArgs) and issubclass(EvalConfig, SamplingArgs)
    assert issubclass(EvalConfig, ModelArgs)
    (ecfg,) = parse_config(
        [EvalConfig], ["--tool_overrides", "{detect: {box_threshold: 0.1}}", "--executor_slots", "3"]
    )
    assert ecfg.tool_overrides == {"detect": {"box_threshold": 0.1}} and ecfg.runner_config().slots == 3
    rest = parse_rl_config(["--algorithm", "rest", "--output_dir", "x", "--num_generations", "4", "--top_p", "0.5"])
    grpo = parse_rl_config(["--output_dir", "x", "--num_generations", "4", "--top_p", "0.5"])
    # the same keys reach ReST's sampler and trl's GRPO arguments
    assert rest.sampling.settings().n == grpo.sampling.settings().n == 4 == grpo.training.num_generations
    assert rest.sampling.top_p == grpo.training.top_p == 0.5
    names = {"tool_stack", "executor_slots", "executor_sandbox", "num_generations", "temperature", "top_p"}
    assert names | {"max_completion_length"} <= set(BootstrapConfig.__dataclass_fields__)
    with pytest.raises(ConfigError, match=r"executor_sandbox: 'fortress' is not one of"):
        parse_rl_config(["--output_dir", "x", "--executor_sandbox", "fortress"])


def test_program_rewards_and_executor_run_take_the_same_names():
    from vprl import program_rewards

    with pytest.raises(TypeError, match=r"program_rewards: tools is now tool_stack"):
        program_rewards("correctness", tools="shapes")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vprl.executor.run",
            "--examples",
            "e",
            "--programs",
            "p",
            "--out",
            "o",
            "--tools",
            "x",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 2 and proc.stderr.splitlines()[0] == (
        "error: python -m vprl.executor.run: --tools is now --tool_stack "
        "(one name per setting in every command: docs/configs.md)"
    )
