"""What trl logs for each reward component: `rewards/<name>/mean` is trl's nanmean of the values a
component's reward function returned, so a None drops that completion from the mean. A program
that failed to run must count as 0 there, or `rewards/correctness/mean` is the accuracy of the
programs that ran, above the policy's accuracy over every program it wrote."""

from __future__ import annotations

import asyncio
import math

from vprl.data.records import Example
from vprl.executor.results import ExecutionResult
from vprl.rewards.compose import RewardBatch
from vprl.rewards.trl_adapter import TrlRewardAdapter


class _Scored:
    def __init__(self, results, rewards):
        self.results, self.rewards = results, rewards


class _Scorer:
    """'good' runs and is right, 'bad' runs and is wrong, 'crash' raises, 'infra' is our failure,
    'untested' runs but the component has nothing to say about it."""

    STATUS = {"good": "ok", "bad": "ok", "untested": "ok", "crash": "runtime_error", "infra": "infra_error"}

    async def ascore(self, examples, programs):
        status = [self.STATUS[p] for p in programs]
        results = [
            ExecutionResult(e.id, p, s, answer=p if s == "ok" else None) for e, p, s in zip(examples, programs, status)
        ]
        comp = [{"good": 1.0, "bad": 0.0}.get(p) for p in programs]  # the composer's None for failures
        totals = [{"ok": c, "runtime_error": -0.5}.get(s) for c, s in zip(comp, status)]
        return _Scored(results, RewardBatch(totals, {"correctness": comp}, status))

    def metrics(self):
        return {}


def test_a_failed_program_counts_as_zero_in_the_logged_component_mean():
    ex = Example(id="e1", dataset="gqa", task="vqa", query="q?", image="x.png", answers=("a",))
    adapter = TrlRewardAdapter(_Scorer(), {"e1": ex}, lambda prompt, c: c, ["correctness"])
    completions = ["good", "crash", "crash", "bad", "infra", "untested"]
    kwargs = {"example_id": ["e1"] * len(completions)}

    async def all_funcs():
        return await asyncio.gather(
            *[f(prompts=["p"] * len(completions), completions=completions, **kwargs) for f in adapter.reward_funcs]
        )

    total, correctness = asyncio.run(all_funcs())
    assert total == [1.0, -0.5, -0.5, 0.0, None, None]
    # crashes answered nothing: 0; nobody scored the infra error, nothing was said about 'untested'
    assert correctness == [1.0, 0.0, 0.0, 0.0, None, None]
    logged = [v for v in correctness if v is not None]  # trl's nanmean
    assert math.isclose(sum(logged) / len(logged), 1 / 4)  # 1 right of the 4 scored programs, not 1 of 2


def test_a_run_whose_every_program_is_our_failure_stops_and_says_why():
    """On the first GPU run a tool failed on its device: every program was `infra_error`, trl got
    None for all of them, warned, and stepped with a zero loss, twice. The adapter now stops the run
    after `max_failed_batches` such batches in a row, naming the errors; one batch that scored any
    program resets the count."""
    import pytest

    from vprl.rewards.trl_adapter import InfraFailure

    ex = Example(id="e1", dataset="gqa", task="vqa", query="q?", image="x.png", answers=("a",))
    adapter = TrlRewardAdapter(_Scorer(), {"e1": ex}, lambda prompt, c: c, ["correctness"], max_failed_batches=2)
    total = adapter.reward_funcs[0]

    def batch(completions, n):  # distinct prompts: each call is a batch of its own
        return asyncio.run(
            total(prompts=[f"p{n}"] * len(completions), completions=completions, example_id=["e1"] * len(completions))
        )

    assert batch(["infra", "infra"], 1) == [None, None]
    assert batch(["infra", "good"], 2) == [None, 1.0]  # something scored: the count starts again
    assert batch(["infra", "infra"], 3) == [None, None]
    with pytest.raises(InfraFailure, match=r"last 2 batches ended in infra_error"):
        batch(["infra", "infra"], 4)
