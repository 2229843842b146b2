"""Issue #24, fault 6 (timeouts): a looping program cannot hold a training step (and every GPU
waiting on it) past the bound chosen from ViUniT's ([U] C.3: 120 s per program, its model calls
included; docs/references.md#execution-and-errors)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from test_runner import FaultyOracle
from test_sandbox import make_world

from vprl.executor.host import ToolHost
from vprl.executor.runner import BatchRunner, RunnerConfig, SyncRunner
from vprl.train.recipe.rl_config import parse_rl_config

REPO = Path(__file__).resolve().parents[1]
GPU_RECIPES = sorted(p.name for p in (REPO / "configs").glob("*.yaml") if p.name.startswith(("grpo_", "rest_")))
VIUNIT_BOUND_S = 120.0  # [U] C.3
OWN_TIME_S = 5.0  # the program's own time the recipes allow (docs/references.md#execution-and-errors)

BUSY = "def execute_command(image):\n    while True:\n        pass\n"
# Every question is new, so no call is answered from the cache: each one waits on the (slow) model.
ASKING = (
    "def execute_command(image):\n    i = 0\n    while True:\n"
    "        ImagePatch(image).simple_query('what color is the cat number ' + str(i) + '?')\n        i += 1\n"
)


def _recipe_runner(name: str) -> RunnerConfig:
    """The runner a recipe's run builds (vprl/train/recipe/checks.py)."""
    executor = parse_rl_config(["--config", str(REPO / "configs" / name)]).executor
    return RunnerConfig(slots=2, timeout_s=executor.executor_timeout_s, max_rpcs=executor.executor_max_rpcs)


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_a_looping_program_cannot_hold_a_gpu_recipes_step_past_viunits_bound(recipe):
    """Fault: the recipes gave a program 120 s of its *own* time, tool waits excluded, so one that looped
    held the step for two minutes, and one that kept calling tools for longer still."""
    config = _recipe_runner(recipe)
    assert config.longest_hold_s <= VIUNIT_BOUND_S


def test_a_busy_loop_holds_a_gpu_recipes_step_for_seconds_not_minutes(tmp_path):
    """Fault: a `while True: pass` held the step (and every GPU) for the recipes' 120 s."""
    (config,) = {_recipe_runner(name) for name in GPU_RECIPES}  # one value for every recipe
    host, examples = make_world(tmp_path)

    async def run():
        async with BatchRunner(host, config) as runner:
            start = time.monotonic()
            (result,) = await asyncio.wait_for(runner.run([(examples[0], BUSY)]), OWN_TIME_S + 3.0)
            return result, time.monotonic() - start

    try:
        result, seconds = asyncio.run(run())
    finally:
        host.close()
    assert result.status == "timeout" and seconds < OWN_TIME_S + 3.0, (result, seconds)


def test_a_program_looping_over_tool_calls_is_stopped_by_the_wall_bound(tmp_path):
    """Fault: the program's clock stops while it waits on a tool, so a program that never stops asking
    ran until its 200th call: 200 model calls' worth of time. 0.3 s per call here."""
    host, examples = make_world(tmp_path)
    backend = FaultyOracle(host.images, scenes=host.backend.scenes)
    backend.fault = "slow"
    host = ToolHost(backend)
    host.preload()  # as a run does: the oracle's noun library takes seconds to import on a busy CPU
    config = RunnerConfig(slots=1, timeout_s=1.0, wall_timeout_s=2.0, max_rpcs=1000)
    start = time.monotonic()
    with SyncRunner(host, config) as runner:
        (result,) = runner.run([(examples[0], ASKING)])
        again = runner.run([(examples[1], "def execute_command(image):\n    return 5\n")])
    seconds = time.monotonic() - start
    host.close()
    assert result.status == "timeout" and "after its first tool call" in result.error, result
    assert 3 <= len(result.tool_calls) <= 8 and seconds < config.longest_hold_s + 3.0, (
        len(result.tool_calls),
        seconds,
    )
    assert again[0].status == "ok"  # the runner carries on


def test_a_program_that_finishes_its_tool_calls_in_time_is_not_stopped(tmp_path):
    host, examples = make_world(tmp_path)
    backend = FaultyOracle(host.images, scenes=host.backend.scenes)
    backend.fault = "slow"
    host = ToolHost(backend)
    host.preload()  # as a run does: the oracle's noun library takes seconds to import on a busy CPU
    program = (
        "def execute_command(image):\n    p = ImagePatch(image)\n"
        "    return [p.simple_query(q) for q in ('what color is the cat?', 'is there a dog?')]\n"
    )
    with SyncRunner(host, RunnerConfig(slots=1, timeout_s=1.0, wall_timeout_s=3.0)) as runner:
        (result,) = runner.run([(examples[0], program)])
    host.close()
    assert result.status == "ok" and result.answer == ["black", "yes"], result


def test_a_wall_bound_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="wall_timeout_s must be > 0"):
        RunnerConfig(wall_timeout_s=0)
