"""`TrlRewardAdapter.prefetch`: a batch starts scoring on trl's loop right after generation and the
reward functions take the running task. One scoring per batch, the same rewards as without
prefetching, metrics and `on_batch` once, errors raised at the reward call, a bounded store.
(The trainer side, with the tiny policy, is `test_rl_train.py::test_execution_starts_before_the_reward_call`.)"""

import asyncio
import threading
import time

import pytest

from vprl.data.records import Example
from vprl.executor.results import ExecutionResult
from vprl.rewards.compose import RewardBatch
from vprl.rewards.trl_adapter import BatchTiming, TrlRewardAdapter

EXAMPLES = {
    f"e{i}": Example(id=f"e{i}", dataset="gqa", task="vqa", query="q?", image="x.png", answers=("a",))
    for i in range(3)
}


class _Scored:
    def __init__(self, results, rewards):
        self.results, self.rewards = results, rewards


class _SlowScorer:
    """Scores 'good' 1 and anything else 0 after `delay` seconds; records each call and its start
    time; raises for a program 'boom'."""

    def __init__(self, delay=0.0):
        self.delay, self.calls, self.started = delay, [], []

    async def ascore(self, examples, programs):
        self.calls.append(list(programs))
        self.started.append(time.perf_counter())
        await asyncio.sleep(self.delay)
        if "boom" in programs:
            raise RuntimeError("the executor broke")
        results = [ExecutionResult(e.id, p, "ok", answer=p) for e, p in zip(examples, programs)]
        comp = [float(p == "good") for p in programs]
        return _Scored(results, RewardBatch([2 * c for c in comp], {"correctness": comp}, ["ok"] * len(programs)))

    def metrics(self):
        return {"cache_hit_rate": 0.5}


@pytest.fixture
def loop():
    """A loop on a daemon thread, as trl's `async_loop`."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def _adapter(scorer, batches=None, **kwargs):
    return TrlRewardAdapter(
        scorer, EXAMPLES, lambda prompt, c: c.strip(), ["correctness"], on_batch=batches.append, **kwargs
    )


def _call_rewards(adapter, loop, prompts, completions, ids, metrics):
    """What trl's `_calculate_rewards` does with async reward functions."""
    kwargs = {"example_id": ids, "log_metric": lambda k, v: metrics.setdefault(k, []).append(v)}

    async def gather():
        return await asyncio.gather(
            *[f(prompts=prompts, completions=completions, **kwargs) for f in adapter.reward_funcs]
        )

    return asyncio.run_coroutine_threadsafe(gather(), loop).result(timeout=10)


PROMPTS = ["p0", "p1", "p2"]
IDS = ["e0", "e1", "e2"]


def test_prefetched_batch_scores_once_with_the_same_rewards(loop):
    plain_batches, plain_metrics = [], {}
    plain = _adapter(_SlowScorer(), plain_batches)
    completions = ["good", "bad", "good"]
    expected = _call_rewards(plain, loop, PROMPTS, completions, IDS, plain_metrics)

    scorer, batches, metrics = _SlowScorer(delay=0.2), [], {}
    adapter = _adapter(scorer, batches)
    adapter.prefetch(list(PROMPTS), list(completions), IDS, loop)  # other list objects, same content
    assert len(scorer.calls) == 1  # started before any reward function is called
    time.sleep(0.3)  # the trainer's forward passes
    got = _call_rewards(adapter, loop, PROMPTS, completions, IDS, metrics)
    assert got == expected == [[2.0, 0.0, 2.0], [1.0, 0.0, 1.0]]
    assert len(scorer.calls) == 1 and len(batches) == 1 and batches[0].programs == completions
    assert metrics["exec/ok"] == [1.0] and metrics["tools/cache_hit_rate"] == [0.5]  # once per batch
    (timing,) = adapter.timings
    assert timing.prefetched and timing.waited_s < 0.05 and timing.hidden_s > 0.15
    assert BatchTiming.from_json(timing.to_json()) == timing
    assert not adapter._batches  # taken: nothing left behind

    # without a prefetch (or with one of other content) the reward call scores the batch itself
    other = ["bad", "bad", "good"]
    assert _call_rewards(adapter, loop, PROMPTS, other, IDS, metrics)[0] == [0.0, 0.0, 2.0]
    assert len(scorer.calls) == 2 and not adapter.timings[-1].prefetched and adapter.timings[-1].hidden_s < 0.05


def test_conversational_completions_match_their_text(loop):
    scorer = _SlowScorer()
    adapter = _adapter(scorer, [])
    completions = [[{"role": "assistant", "content": c}] for c in ("good", "bad", "bad")]
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS]
    adapter.prefetch(prompts, completions, IDS, loop)
    assert _call_rewards(adapter, loop, prompts, completions, IDS, {})[0] == [2.0, 0.0, 0.0]
    assert len(scorer.calls) == 1


def test_an_error_while_prefetched_scoring_is_raised_at_the_reward_call(loop):
    scorer, batches = _SlowScorer(), []
    adapter = _adapter(scorer, batches)
    adapter.prefetch(PROMPTS, ["good", "boom", "bad"], IDS, loop)
    time.sleep(0.05)  # it has failed already
    with pytest.raises(RuntimeError, match="the executor broke"):
        _call_rewards(adapter, loop, PROMPTS, ["good", "boom", "bad"], IDS, {})
    assert len(scorer.calls) == 1 and not batches and not adapter._batches
    # an unknown example id is the same: raised where the rewards are asked for
    adapter.prefetch(PROMPTS, ["a", "b", "c"], ["e0", "nope", "e1"], loop)
    with pytest.raises(KeyError, match="'nope'"):
        _call_rewards(adapter, loop, PROMPTS, ["a", "b", "c"], ["e0", "nope", "e1"], {})


def test_untaken_prefetches_are_bounded(loop, caplog):
    scorer = _SlowScorer(delay=0.05)
    adapter = _adapter(scorer, [], max_prefetched=2)
    batches = [[f"p{i}", "x", "y"] for i in range(5)]
    for completions in batches:
        adapter.prefetch(PROMPTS, completions, IDS, loop)
    assert len(adapter._batches) == 2 and len(scorer.calls) == 5
    assert sum("never taken" in r.message for r in caplog.records) == 3
    # the newest are kept and taken without scoring again; the dropped ones finish and are released
    assert _call_rewards(adapter, loop, PROMPTS, batches[-1], IDS, {})[0] == [0.0, 0.0, 0.0]
    assert len(scorer.calls) == 5
    deadline = time.time() + 5
    while adapter._dropped and time.time() < deadline:
        time.sleep(0.01)
    assert not adapter._dropped and len(adapter._batches) == 1
    with pytest.raises(RuntimeError, match="another thread"):
        asyncio.run_coroutine_threadsafe(_prefetch_from_the_loop(adapter, loop), loop).result(timeout=5)
    with pytest.raises(ValueError, match="max_prefetched"):
        _adapter(scorer, [], max_prefetched=0)


async def _prefetch_from_the_loop(adapter, loop):
    adapter.prefetch(PROMPTS, ["a", "b", "c"], IDS, loop)


def test_item5_rewards_used_as_a_subset_release_their_batches(loop):
    """#37 item 5: a trl script passing some of the functions (`funcs[:-1]`) must not keep every
    batch it scored; the full set, as before, releases each batch once every function took it."""
    full_scorer = _SlowScorer()
    full = _adapter(full_scorer, [])
    subset_scorer = _SlowScorer()
    subset = _adapter(subset_scorer, [])
    kept = []
    for i in range(200):
        completions = [f"x{i}", "good", "bad" if i % 2 else "good"]
        kwargs = {"example_id": IDS}

        async def gather(adapter, funcs, completions=completions, kwargs=kwargs):
            return await asyncio.gather(*[f(prompts=PROMPTS, completions=completions, **kwargs) for f in funcs])

        expected = asyncio.run_coroutine_threadsafe(gather(full, full.reward_funcs), loop).result(timeout=10)
        got = asyncio.run_coroutine_threadsafe(gather(subset, subset.reward_funcs[:1]), loop).result(timeout=10)
        assert got == expected[:1], i
        assert not full._batches, i  # the full set releases each batch at once
        kept.append(len(subset._batches))
    assert max(kept) <= 1 and kept[-1] == 0  # learned after the first batches: released at its last use
    assert len(subset_scorer.calls) == len(full_scorer.calls) == 200  # each batch scored once, never again
