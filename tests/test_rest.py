"""The ReST loop on CPU: a tiny LoRA policy, the shapes world, the sandboxed executor with the
oracle tools, the correctness reward, trl's SFTTrainer.

A random tiny policy never writes a rewarded program, so two kinds of test run here:
- `PoolGenerator` (a test double, tests/rest_helpers.py) hands back the bodies of real programs — the world's gold
  program, wrong answers, crashes — so the loop has something to keep; everything after sampling
  (executor, rewards, selection, SFT on the policy, adapters, log, resume) is real. It checks that
  SFT raises the likelihood of the kept program under the exact prompt ids the generator uses.
- the real `HFGenerator` on the random policy: nothing is rewarded, the loop says so, trains
  nothing and carries the adapter over.

Prompts are short (`# query` + signature, `rest_helpers.prompt_for`) instead of the full API listing.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch
from rest_helpers import (
    SIGNATURE,
    PoolGenerator,
    build_policy,
    build_tokenizer,
    build_world,
    oracle_scorer,
    pools_for,
    prompt_for,
    sft_args,
    world_corpus,
)
from safetensors.torch import load_file

from vprl.train.prompts import encode_prompt, frame_prompt
from vprl.train.recipe.parsing import ConfigError
from vprl.train.recipe.sections import RestArgs, SamplingArgs
from vprl.train.rest.iterations import adapter_dir, initial_adapter_dir, read_summary
from vprl.train.rest.loop import run_rest
from vprl.train.rest.select import select_kept
from vprl.train.rest.sft import program_body, sft_example
from vprl.train.rollouts.log import RolloutLog, RolloutRow
from vprl.train.sampling.hf import HFGenerator

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("shapes"))


@pytest.fixture(scope="module")
def scorer(world):
    with oracle_scorer(world[0]) as scorer:
        yield scorer


def adapter_tensors(path):
    return load_file(str(path / "adapter_model.safetensors"))


def same_tensors(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def body_nll(model, tokenizer, prompt, program) -> float:
    ex = sft_example(tokenizer, prompt, program)
    ids = torch.tensor([ex["input_ids"]])
    labels = ids.clone()
    labels[0, torch.tensor(ex["completion_mask"]) == 0] = -100
    model.eval()
    with torch.no_grad():
        return float(model(input_ids=ids, labels=labels).loss)


def test_selection_dedupes_caps_and_never_keeps_masked_rows():
    def row(program, total, key):
        return RolloutRow(
            step=0, example_id="e", prompt_hash="h", program=program, status="ok", total=total, program_key=key
        )

    rows = [row("a", 1.0, "k1"), row("a2", 1.0, "k1"), row("b", 0.5, "k2"), row("c", None, "k3"), row("d", 0.7, "k4")]
    items = [0, 0, 0, 0, 1]
    kept = select_kept(rows, items, RestArgs())
    assert [(k.item, k.program) for k in kept] == [(0, "a"), (0, "b"), (1, "d")]
    capped = select_kept(rows, items, RestArgs(rest_max_kept_per_query=1, rest_keep_threshold=0.6))
    assert [k.program for k in capped] == ["a", "d"]
    at_least = RestArgs(rest_keep_threshold=1.0, rest_keep_rule="at_least")
    assert [k.program for k in select_kept(rows, items, at_least)] == ["a"]
    with pytest.raises(ConfigError, match="rest_keep_rule"):
        RestArgs(rest_keep_rule="best")
    with pytest.raises(ConfigError, match="rest_max_kept_per_query"):
        RestArgs(rest_max_kept_per_query=0)


@pytest.mark.parametrize("chat", [False, True])
def test_sft_example_trains_on_the_body_after_the_generators_own_prompt_ids(tmp_path, world, chat):
    template = (
        "{{ bos_token }}{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    tok = build_tokenizer(tmp_path, world_corpus(world), chat_template=template if chat else None)
    prompt, program = prompt_for(world[1][0].query), world[2][0]
    ex = sft_example(tok, prompt, program)
    prompt_ids = encode_prompt(frame_prompt(prompt, tok), tok)  # what HFGenerator / VLLMGenerator feed
    n = len(prompt_ids)
    assert ex["input_ids"][:n] == prompt_ids and ex["completion_mask"] == [0] * n + [1] * (len(ex["input_ids"]) - n)
    assert ex["input_ids"].count(tok.bos_token_id) == 1 and ex["input_ids"][-1] == tok.eos_token_id
    assert tok.decode(ex["input_ids"][n:-1]) == program_body(program)
    assert tok.decode(prompt_ids).endswith(SIGNATURE)
    assert sft_example(tok, prompt, "return 1\n") is None  # no entry point: nothing to learn


def test_rest_keeps_rewarded_programs_trains_and_resumes(tmp_path, world, scorer):
    _, examples, gold = world
    items = [(e, prompt_for(e.query)) for e in examples]
    pools = pools_for(world)
    rest = RestArgs(rest_iterations=1)
    sampling = SamplingArgs(num_generations=4, max_completion_length=16)
    sft = sft_args(tmp_path, num_train_epochs=3, per_device_train_batch_size=1, learning_rate=2e-2, seed=7)
    run_dir = tmp_path / "run"
    log = RolloutLog.in_run(run_dir)
    model, tok = build_policy(tmp_path / "policy", world_corpus(world))
    nll_before = body_nll(model, tok, items[0][1], gold[0])
    gen = PoolGenerator(pools, model)
    kwargs = dict(
        tokenizer=tok,
        items=items,
        scorer=scorer,
        sft=sft,
        sampling=sampling,
        style="auto",
        run_dir=run_dir,
        log=log,
        prompt_hash="ph",
        policy_name="tiny",
    )

    paths = run_rest(model=model, generator=gen, rest=rest, **kwargs)
    assert paths == [adapter_dir(run_dir, 0)]
    s0 = read_summary(run_dir, 0)
    assert (s0.samples, s0.masked, s0.rewarded, s0.kept, s0.kept_queries) == (12, 0, 3, 2, 2)
    assert s0.zero_variance_groups == 1 and s0.trained and s0.train_loss is not None and s0.sft_examples == 2
    assert s0.status_rates == {"ok": 11 / 12, "runtime_error": 1 / 12} and s0.mean_reward == pytest.approx(
        (3 - 0.5) / 12
    )
    kept = [json.loads(line) for line in (run_dir / "iterations/iter-0/kept.jsonl").read_text().splitlines()]
    assert [(k["example_id"], k["total"]) for k in kept] == [(examples[0].id, 1.0), (examples[1].id, 1.0)]
    rows = log.read()
    assert (
        len(rows) == 12 and {r.step for r in rows} == {0} and rows[0].prompt_hash == "ph" and rows[0].policy == "tiny"
    )
    assert sum(r.total == 1.0 for r in rows) == 3
    # SFT taught the kept program: its likelihood under the sampling prompt went up
    assert body_nll(model, tok, items[0][1], gold[0]) < nll_before - 0.1
    init, a0 = adapter_tensors(initial_adapter_dir(run_dir)), adapter_tensors(adapter_dir(run_dir, 0))
    assert not same_tensors(init, a0)
    assert gen.calls == [([p for _, p in items], 4, 7)]

    # A run killed during iteration 1: its rows reached the log, its adapter did not.
    log.append([RolloutRow(step=1, example_id="x", prompt_hash="ph", program="p", status="ok", total=1.0)])
    (run_dir / "iterations/iter-1/adapter.tmp").mkdir(parents=True)
    # Restarted with 2 iterations on a freshly built policy: iteration 0 is skipped, its adapter is
    # loaded before sampling, iteration 1 runs once and its rows replace the torn ones.
    model2, _ = build_policy(tmp_path / "policy2", world_corpus(world))
    gen2 = PoolGenerator(pools, model2)
    rest2 = dataclasses.replace(rest, rest_iterations=2)
    paths = run_rest(model=model2, generator=gen2, rest=rest2, **kwargs)
    assert paths == [adapter_dir(run_dir, 0), adapter_dir(run_dir, 1)]
    assert [c[2] for c in gen2.calls] == [8]  # only iteration 1 sampled (seed + iteration)
    assert gen2.lora_sums[0] == pytest.approx(float(sum(t.abs().sum() for t in a0.values())), rel=1e-5)
    rows = log.read()
    assert [sum(r.step == k for r in rows) for k in (0, 1)] == [12, 12] and "x" not in {r.example_id for r in rows}
    assert not same_tensors(a0, adapter_tensors(adapter_dir(run_dir, 1)))
    assert read_summary(run_dir, 1).kept == 2 and not (run_dir / "iterations/iter-1/adapter.tmp").exists()

    # Everything done: nothing is sampled again.
    gen3 = PoolGenerator(pools)
    assert run_rest(model=model2, generator=gen3, rest=rest2, **kwargs) == paths and gen3.calls == []
    with pytest.raises(FileNotFoundError, match="iteration 2 has no adapter"):
        run_rest(model=model2, generator=gen3, rest=RestArgs(rest_iterations=5), start_iteration=3, **kwargs)


def test_rest_with_the_random_policy_keeps_nothing_and_carries_on(tmp_path, world, scorer, caplog):
    _, examples, _ = world
    items = [(e, prompt_for(e.query)) for e in examples[:2]]
    model, tok = build_policy(tmp_path / "policy", world_corpus(world), seed=1)
    run_dir = tmp_path / "run"
    log = RolloutLog.in_run(run_dir)
    with caplog.at_level(logging.WARNING, logger="vprl.train.rest.select"):
        run_rest(
            model=model,
            tokenizer=tok,
            items=items,
            scorer=scorer,
            generator=HFGenerator(model, tok, batch_size=4),
            rest=RestArgs(rest_iterations=1),
            sampling=SamplingArgs(num_generations=2, max_completion_length=8),
            sft=sft_args(tmp_path, seed=0),
            style="auto",
            run_dir=run_dir,
            log=log,
            prompt_hash="ph",
            policy_name="random",
        )
    s = read_summary(run_dir, 0)
    assert (s.samples, s.kept, s.trained, s.sft_examples) == (4, 0, False, 0)
    assert "nothing to train on" in caplog.text
    assert len(log.read()) == 4 and all(r.total is not None and r.total <= 0 for r in log.read())
    assert same_tensors(adapter_tensors(initial_adapter_dir(run_dir)), adapter_tensors(adapter_dir(run_dir, 0)))


def test_restart_from_base_trains_every_iteration_from_the_initial_adapter(tmp_path, world, scorer):
    # The pool gives the same samples each iteration, so restarting from the initial adapter with the
    # same seed must give the same adapter twice (continuing, as in the test above, does not).
    items = [(e, prompt_for(e.query)) for e in world[1]]
    model, tok = build_policy(tmp_path / "policy", world_corpus(world))
    run_dir = tmp_path / "run"
    rest = RestArgs(rest_iterations=2, rest_restart_from_base=True)
    sft = sft_args(tmp_path, per_device_train_batch_size=2, learning_rate=2e-2, warmup_steps=0)
    run_rest(
        model=model, tokenizer=tok, items=items, scorer=scorer, generator=PoolGenerator(pools_for(world), model),
        rest=rest, sft=sft, sampling=SamplingArgs(num_generations=4), style="auto", run_dir=run_dir, log=RolloutLog.in_run(run_dir),
        prompt_hash="ph", policy_name="tiny",
    )  # fmt: skip
    a0, a1 = adapter_tensors(adapter_dir(run_dir, 0)), adapter_tensors(adapter_dir(run_dir, 1))
    assert same_tensors(a0, a1) and not same_tensors(a0, adapter_tensors(initial_adapter_dir(run_dir)))
    assert [read_summary(run_dir, k).adapter_source for k in (0, 1)] == ["initial", "initial"]
