"""vprl's rewards in a user's trainer (issue #26), the two promises beyond the entry points
themselves: the same completions score the same through `vprl/train/rl.py`'s trl reward functions,
through `for_trl.program_rewards` and through `for_verl`'s batch function; and programs that
crash, hang, answer the wrong kind or try to escape, or a sandbox supervisor that dies between two
batches, never raise into the trainer nor hang its step."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import time
from pathlib import Path

import pytest
from rl_tiny import build_policy, build_world, write_recipe
from test_trl_entry import _call, _completions

from vprl.executor.runner_config import RunnerConfig
from vprl.executor.sandbox.connection import SandboxUnavailable, SupervisorConnection
from vprl.train.integrations import for_verl, verl_data
from vprl.train.integrations.for_trl import program_rewards, trl_dataset
from vprl.train.integrations.session import ScoringSession, runner_from_json
from vprl.train.prompts import completion_to_program

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WEIGHTS = {"correctness": 1.0, "executes": 0.25}
PENALTIES = {"runtime_error": -0.3}
# A looping program must end in a second, not in the default 5 s per slot.
FAST = RunnerConfig(slots=2, timeout_s=1.0, wall_timeout_s=5.0)
# What each escape attempt may do is tests/test_hostile.py's matter; here one that gets through still
# answers "escaped", never the question's answer, so only the right program may earn correctness.
HOSTILE = {
    "raises": "\n    raise ValueError('boom')\n",
    "loops": "\n    while True:\n        pass\n",
    "dict": "\n    return {'answer': 'yes'}\n",
    "patch": "\n    return ImagePatch(image)\n",
    "passwd": "\n    return open('/etc/passwd').read()\n",
    "socket": (
        "\n    import socket\n    s = socket.socket()\n    s.settimeout(0.5)\n"
        "    s.connect(('1.1.1.1', 80))\n    return 'escaped'\n"
    ),
    "fork": "\n    import os\n    os.fork()\n    return 'escaped'\n",
    "subprocess": "\n    return __import__('subprocess').check_output(['id']).decode()\n",
}


@pytest.fixture(scope="module", autouse=True)
def _close_verl_sessions():
    yield
    for_verl.close()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """One recipe for all three doors: the world, a tiny policy (rl.py's trainer needs one to be
    built; it generates nothing here), the recipe and verl's data and settings written from it."""
    root = tmp_path_factory.mktemp("robust")
    world = build_world(root / "world")
    policy = build_policy(root / "policy", world, fit_steps=1)
    recipe = write_recipe(
        root / "recipe.yaml",
        model_name_or_path=str(policy),
        dataset_root=str(world),
        tool_stack="shapes",
        output_dir=str(root / "run"),
        rewards=[{"name": name, "weight": weight} for name, weight in WEIGHTS.items()],
        reward_penalties=PENALTIES,
    )
    return world, recipe, verl_data.main(["--config", str(recipe)])


def _weighted(values: list[list[float | None]], weights: list[float]) -> list[float | None]:
    """trl's sum of weight x value per completion over the functions that said something; None
    where none did (trl masks it)."""
    out = []
    for i in range(len(values[0])):
        parts = [w * v[i] for w, v in zip(weights, values, strict=True) if v[i] is not None]
        out.append(sum(parts) if parts else None)
    return out


def _rl_py_totals(recipe: Path, examples, texts) -> list[float | None]:
    """The reward functions `vprl/train/rl.py` hands trl's GRPOTrainer, built by its own code:
    the recipe checked, the executor opened and the trainer built as `rl.main` does."""
    from vprl.rewards.compose import RewardComposer
    from vprl.train import rl
    from vprl.train.online.run import build_trainer
    from vprl.train.recipe.checks import validate
    from vprl.train.recipe.data import build_prompts
    from vprl.train.recipe.rl_config import parse_rl_config

    cfg = parse_rl_config(["--config", str(recipe)])
    checked = validate(cfg)
    prompted = build_prompts(checked.examples, checked.prompts)
    run_dir = Path(cfg.training.output_dir)
    with rl.executor(checked) as (runner, host, _):
        resources = {"runner": runner, "tool_host": host, "run_dir": str(run_dir)}
        composer = RewardComposer(checked.rewards, resources=resources)
        trainer, _ = build_trainer(cfg, prompted, composer, runner, run_dir)
        prompt_of = {row["example_id"]: row["prompt"] for row in trainer.train_dataset}
        ids = [ex.id for ex in examples]
        prompts = [prompt_of[i] for i in ids]

        async def batch():
            calls = [f(prompts=prompts, completions=texts, example_id=ids) for f in trainer.reward_funcs]
            return await asyncio.gather(*calls)

        values = asyncio.run(batch())
        weights = [float(w) for w in trainer.reward_weights]
    return _weighted(values, weights)


@pytest.mark.timeout(600)
def test_the_same_completions_score_the_same_through_every_door(prepared):
    world, recipe, out = prepared
    examples, texts = _completions(world)  # right, right, constant, syntax error, runtime error
    settings = json.loads((out / "vprl_reward.json").read_text())

    via_rl = _rl_py_totals(recipe, examples, texts)

    prompts = list(trl_dataset(examples, layout="bare")["prompt"])
    runner = runner_from_json(settings["runner"], "vprl_reward.json: runner")  # the recipe's executor settings
    with program_rewards(WEIGHTS, tool_stack="shapes", runner=runner, penalties=PENALTIES) as rewards:
        via_trl = _weighted(_call(rewards, prompts, texts, examples), rewards.weights)

    extra = [
        {
            "example": json.dumps(verl_data.absolute_image(ex).to_json(), sort_keys=True),
            "prompt_tail": p.splitlines()[-1],
        }
        for ex, p in zip(examples, prompts, strict=True)
    ]
    rows = for_verl.compute_score_batch(
        ["shapes"] * len(texts), texts, [""] * len(texts), extra, settings=str(out / "vprl_reward.json")
    )
    via_verl = [r["score"] if r["scorable"] else None for r in rows]

    # the completions do differ (a test of equal constants would prove nothing), with the recipe's penalty
    assert via_trl[0] == pytest.approx(1.25) and via_trl[3:] == pytest.approx([-1.0, -0.3])
    assert via_trl[2] == pytest.approx(0.25) or via_trl[2] == pytest.approx(1.25)
    for i, (a, b, c) in enumerate(zip(via_rl, via_trl, via_verl, strict=True)):
        assert (a is None) == (b is None) == (c is None), (i, a, b, c)
        if a is not None:
            assert a == pytest.approx(b) and b == pytest.approx(c), (i, a, b, c)


def _hostile_batch(world):
    examples, texts = _completions(world)
    right, example = texts[0], examples[0]
    names = ["right", *HOSTILE]
    return names, [example] * len(names), [right, *HOSTILE.values()]


def _check_every_completion_scored(names, values, weights):
    """A list per function, one finite value or None per completion, and none of the hostile
    programs credited like the right one."""
    assert len(values) == len(weights)
    for per_function in values:
        assert len(per_function) == len(names)
        assert all(v is None or (isinstance(v, float | int) and math.isfinite(v)) for v in per_function), values
    totals = _weighted(values, weights)
    assert totals[0] == pytest.approx(1.25), totals  # the right program still scores with them
    for name, total in zip(names[1:], totals[1:], strict=True):
        assert total is None or total <= 0.25, (name, total)  # at most "it ran", never "it answered"
    return totals


@pytest.mark.timeout(180)
def test_hostile_programs_get_a_score_each_and_never_raise(prepared):
    world, _, _ = prepared
    names, examples, texts = _hostile_batch(world)
    prompts = list(trl_dataset(examples, layout="bare")["prompt"])
    with program_rewards(WEIGHTS, tool_stack="shapes", runner=FAST, penalties=PENALTIES) as rewards:
        rewards.start()  # the supervisor's start is not the batch's time
        began = time.monotonic()
        values = _call(rewards, prompts, texts, examples)
        took = time.monotonic() - began
        programs = [completion_to_program(p, t) for p, t in zip(prompts, texts, strict=True)]
        statuses = rewards.session.score(examples, programs)
    _check_every_completion_scored(names, values, rewards.weights)
    # the loop was stopped by the runner's clock, not waited out
    assert took < 30, took
    status = dict(zip(names, statuses.rewards.statuses, strict=True))
    assert status["loops"] == "timeout" and status["raises"] == "runtime_error", status


def _kill(session: ScoringSession) -> int:
    """SIGKILL the session's sandbox supervisor, as the OOM killer would, and wait until it is gone."""
    proc = session.start().runner.runner.supervisor.proc
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    return proc.pid


def _supervisor_pid(session: ScoringSession) -> int:
    return session.start().runner.runner.supervisor.proc.pid


@pytest.mark.timeout(180)
def test_a_dead_supervisor_is_restarted_before_the_next_batch(prepared, caplog):
    world, _, _ = prepared
    names, examples, texts = _hostile_batch(world)
    prompts = list(trl_dataset(examples, layout="bare")["prompt"])
    with program_rewards(WEIGHTS, tool_stack="shapes", runner=FAST, penalties=PENALTIES) as rewards:
        first = _call(rewards, prompts, texts, examples)
        dead = _kill(rewards.session)
        began = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="vprl.train.integrations.session"):
            second = _call(rewards, prompts, texts, examples)
        took = time.monotonic() - began
        assert _supervisor_pid(rewards.session) != dead
        third = _call(rewards, prompts, texts, examples)  # and it keeps working after
    assert took < 60, took
    # scored again, not every completion masked as the dead supervisor's infra_error
    assert second == first and third == first
    restarts = [r.getMessage() for r in caplog.records if "restarting the executor" in r.getMessage()]
    assert restarts == [f"vprl's sandbox supervisor (pid {dead}, killed by signal 9) died; restarting the executor"]


@pytest.mark.timeout(180)
def test_a_supervisor_that_cannot_restart_is_one_clear_error(prepared, monkeypatch):
    world, _, _ = prepared
    examples, texts = _completions(world)
    prompts = list(trl_dataset(examples, layout="bare")["prompt"])
    with program_rewards(WEIGHTS, tool_stack="shapes", runner=FAST, penalties=PENALTIES) as rewards:
        _call(rewards, prompts, texts, examples)

        async def refuse(cls, *args, **kwargs):
            raise SandboxUnavailable("the sandbox cannot run here: no user namespaces")

        monkeypatch.setattr(SupervisorConnection, "start", classmethod(refuse))
        dead = _kill(rewards.session)
        began = time.monotonic()
        with pytest.raises(RuntimeError) as raised:
            _call(rewards, prompts, texts, examples)
        assert time.monotonic() - began < 60
    message = str(raised.value)
    assert f"sandbox supervisor (pid {dead}, killed by signal 9) died and restarting it failed" in message
    assert "no user namespaces" in message and "stderr" in message and "dmesg" in message


@pytest.mark.timeout(180)
def test_the_verl_batch_function_survives_hostile_programs_and_a_dead_supervisor(prepared):
    world, _, out = prepared
    names, examples, texts = _hostile_batch(world)
    tail = trl_dataset(examples[:1], layout="bare")["prompt"][0].splitlines()[-1]
    row = {"example": json.dumps(verl_data.absolute_image(examples[0]).to_json(), sort_keys=True), "prompt_tail": tail}
    settings = str(out / "vprl_reward.json")
    fast = {"runner": {"slots": 2, "timeout_s": 1.0, "wall_timeout_s": 5.0}}

    def batch():
        began = time.monotonic()
        scores = for_verl.compute_score_batch(
            ["shapes"] * len(texts), texts, [""] * len(texts), [row] * len(texts), settings=settings, **fast
        )
        return scores, time.monotonic() - began

    first, took = batch()
    assert took < 60, took
    assert len(first) == len(names) and all(math.isfinite(s["score"]) for s in first)
    assert first[0]["score"] == pytest.approx(1.25) and all(s["score"] <= 0.25 for s in first[1:])
    _, session = for_verl._session(settings, fast)
    dead = _kill(session)
    second, took = batch()
    assert took < 60, took
    assert second == first and _supervisor_pid(session) != dead


@pytest.mark.timeout(180)
def test_a_supervisor_that_dies_again_right_after_its_restart_is_not_restarted_forever(prepared):
    world, _, _ = prepared
    examples, texts = _completions(world)
    prompts = list(trl_dataset(examples, layout="bare")["prompt"])
    with program_rewards(WEIGHTS, tool_stack="shapes", runner=FAST, penalties=PENALTIES) as rewards:
        first = _call(rewards, prompts, texts, examples)
        _kill(rewards.session)
        # the restart a batch would make, then a death before any batch finished on the new one:
        # a supervisor dying at start would otherwise be restarted once per step, every step masked
        rewards.session._live()
        again = _kill(rewards.session)
        with pytest.raises(
            RuntimeError, match=rf"\(pid {again}, killed by signal 9\) died again right after a restart"
        ):
            _call(rewards, prompts, texts, examples)
    # a restart that did serve a batch counts as healed: the next death is restarted again
    with program_rewards(WEIGHTS, tool_stack="shapes", runner=FAST, penalties=PENALTIES) as rewards:
        _call(rewards, prompts, texts, examples)
        for _ in range(2):
            _kill(rewards.session)
            assert _call(rewards, prompts, texts, examples) == first
