"""#29 item 5: every numeric option and config key is range-checked before any work: NaN and
infinity always refused, negatives refused unless the key allows them, zero where it means nothing.
(`python -m vprl.executor.run ... --timeout -3` used to exit 0.)"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from vprl.data.ranges import KEY_RANGES, key_problem

REPO = Path(__file__).resolve().parents[1]


def _config_types() -> list[type]:
    from vprl.train.ace.stanic import StanicArgs
    from vprl.train.bootstrap.fit import BootstrapConfig
    from vprl.train.evaluation.config import EvalConfig
    from vprl.train.quickstart import QuickstartConfig
    from vprl.train.recipe.rl_config import SECTIONS
    from vprl.train.recipe.trainer_args import TRAINER_ARGS

    return [*SECTIONS.values(), *TRAINER_ARGS.values(), EvalConfig, StanicArgs, BootstrapConfig, QuickstartConfig]


def _numeric_fields() -> list[tuple[str, str, object]]:
    """(config type, key, default) of every int/float key of every config-file command."""
    out = {}
    for cls in _config_types():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kinds = set(typing.get_args(hints[f.name])) | {hints[f.name]}
            if kinds & {int, float} and bool not in kinds:
                default = f.default if isinstance(f.default, int | float) else None
                out.setdefault(f.name, (cls.__name__, f.name, default))
    return sorted(out.values())


NUMERIC = _numeric_fields()


def test_there_are_numeric_keys_to_check():
    names = {key for _, key, _ in NUMERIC}
    assert {"learning_rate", "executor_timeout_s", "top_p", "batch_size", "max_completion_length"} <= names
    assert len(NUMERIC) > 60


@pytest.mark.parametrize(("owner", "key", "default"), NUMERIC, ids=[k for _, k, _ in NUMERIC])
def test_every_numeric_key_refuses_nan_infinity_and_negatives(owner, key, default):
    for bad in (math.nan, math.inf, -math.inf):
        assert key_problem(key, bad, default), f"{owner}.{key} accepts {bad}"
    negative_allowed = (default is not None and default < 0) or (KEY_RANGES.get(key) and KEY_RANGES[key].low is None)
    if not negative_allowed:
        assert key_problem(key, -7, default), f"{owner}.{key} accepts -7"
    if default is not None and not (isinstance(default, float) and math.isnan(default)):
        assert key_problem(key, default, default) is None, f"{owner}.{key}'s own default is refused"


@pytest.mark.parametrize(
    ("key", "zero_ok"),
    [
        ("learning_rate", False),
        ("per_device_train_batch_size", False),
        ("executor_timeout_s", False),
        ("temperature", False),
        ("top_p", False),
        ("num_generations", False),
        ("beta", True),
        ("warmup_steps", True),
    ],
)
def test_zero_is_refused_where_it_means_nothing(key, zero_ok):
    assert (key_problem(key, 0, None) is None) == zero_ok


def _run(module: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize(
    ("module", "args", "message"),
    [
        (
            "vprl.executor.run",
            ["--examples", "x", "--programs", "y", "--tool_stack", "z", "--out", "o", "--executor_timeout_s", "-3"],
            "--executor_timeout_s/--executor-timeout-s: must be > 0, got -3",
        ),
        (
            "vprl.executor.run",
            ["--examples", "x", "--programs", "y", "--tool_stack", "z", "--out", "o", "--executor_slots", "0"],
            "--executor_slots/--executor-slots: must be >= 1, got 0",
        ),
        ("vprl.data.shapes", ["--out", "w", "--workers", "0"], "--workers: must be >= 1, got 0"),
        ("vprl.data.shapes", ["--out", "w", "--train", "nan"], "expected an integer, got 'nan'"),
        (
            "vprl.train.ace",
            ["from-run", "--run", "r", "--out", "a.jsonl", "--min_unit_test_score", "inf"],
            "must be a finite number, got inf",
        ),
    ],
    ids=["run-timeout", "run-slots", "shapes-workers", "shapes-nan", "ace-inf"],
)
def test_option_out_of_range_is_one_line_and_exit_2(module, args, message):
    result = _run(module, *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr.splitlines()[0]


def test_recipe_key_out_of_range_names_its_file_and_line(tmp_path):
    from vprl.train.recipe.parsing import ConfigError
    from vprl.train.recipe.rl_config import parse_rl_config

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("output_dir: run\nlearning_rate: .nan\ntemperature: 1.0\n")
    with pytest.raises(
        ConfigError,
        match=rf"{recipe}:2: learning_rate: must be > 0, got nan|{recipe}:2: learning_rate: must be a finite",
    ):
        parse_rl_config(["--config", str(recipe)])
    recipe.write_text("output_dir: run\n")
    with pytest.raises(ConfigError, match=r"command line: executor_timeout_s: must be > 0, got -1"):
        parse_rl_config(["--config", str(recipe), "--executor_timeout_s", "-1"])
    with pytest.raises(ConfigError, match=r"command line: top_p: must be <= 1"):
        parse_rl_config(["--config", str(recipe), "--top_p", "1.5"])


def test_evaluation_key_out_of_range(tmp_path):
    from vprl.train.evaluation.config import EvalConfig
    from vprl.train.recipe.parsing import ConfigError, parse_config

    with pytest.raises(ConfigError, match=r"command line: batch_size: must be >= 1, got 0"):
        parse_config([EvalConfig], ["--batch_size", "0"])
