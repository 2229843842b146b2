"""The vLLM generation path, what the generator sends. The main environment has no vLLM, so a fake
engine with vLLM's `LLM.generate` signature and output shape records what the generator sends
(token-id prompts, sampling parameters, LoRA requests) and answers with real program bodies. The real
engine runs the same generator on the CPU in tests/test_vllm_cpu_engine.py (ReST serving a new adapter
per iteration, an evaluation), and the test marked `vllm` here on a GPU."""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from chat_helpers import build_chat_tokenizer
from rest_helpers import (
    build_policy,
    build_tokenizer,
    build_world,
    oracle_scorer,
    pools_for,
    prompt_for,
    sft_args,
    world_corpus,
)

from vprl.train.prompts import encode_prompt, frame_prompt
from vprl.train.recipe.sections import RestArgs, SamplingArgs
from vprl.train.rest.iterations import adapter_dir, initial_adapter_dir
from vprl.train.rest.loop import run_rest
from vprl.train.rollouts.log import RolloutLog
from vprl.train.sampling.generator import policy_sampling
from vprl.train.sampling.vllm_engine import VLLMGenerator, VLLMTypes


@dataclass(frozen=True)
class FakeSamplingParams:  # vllm.SamplingParams' keyword arguments
    n: int
    temperature: float
    top_p: float
    max_tokens: int
    stop: list
    seed: int | None
    stop_token_ids: list | None = None


@dataclass(frozen=True)
class FakeLoRARequest:  # vllm.lora.request.LoRARequest(lora_name, lora_int_id, lora_path)
    lora_name: str
    lora_int_id: int
    lora_path: str


FAKE_TYPES = VLLMTypes(FakeSamplingParams, FakeLoRARequest)


class FakeEngine:
    """Records `generate` calls; answers each prompt from `pools` (keyed by the decoded prompt text)
    with `n` completions, vLLM-shaped: `outputs[i].outputs[j].text`."""

    def __init__(self, tokenizer, pools, suffix=""):
        self.tokenizer, self.pools, self.suffix, self.calls = tokenizer, pools, suffix, []

    def generate(self, prompts, sampling_params=None, *, lora_request=None, use_tqdm=True):
        self.calls.append({"prompts": prompts, "params": sampling_params, "lora": lora_request})
        out = []
        for p in prompts:
            text = self.tokenizer.decode(p["prompt_token_ids"], skip_special_tokens=True)
            pool = self.pools[text]
            completions = [SimpleNamespace(text=pool[j % len(pool)] + self.suffix) for j in range(sampling_params.n)]
            out.append(SimpleNamespace(outputs=completions))
        return out


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("shapes"))


def fake_adapter(path):
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")
    return path


def test_generator_sends_token_ids_params_and_a_new_lora_id_per_adapter(tmp_path, world):
    tok = build_tokenizer(tmp_path / "tok", world_corpus(world))
    pools = pools_for(world)
    prompts = list(pools)[:2]
    engine = FakeEngine(tok, pools, suffix="\n\n\n# next query")
    gen = VLLMGenerator("base-model", tok, engine=engine, types=FAKE_TYPES, use_tqdm=False)
    sampling = policy_sampling(n=3, seed=5)

    out = gen.generate(prompts, sampling)
    assert out == [[pools[p][j] for j in range(3)] for p in prompts]  # cut at the first stop sequence
    call = engine.calls[0]
    ids = [p["prompt_token_ids"] for p in call["prompts"]]
    assert ids == [encode_prompt(frame_prompt(p, tok), tok) for p in prompts]
    assert all(x.count(tok.bos_token_id) == 1 and x[0] == tok.bos_token_id for x in ids)
    assert call["params"] == FakeSamplingParams(3, 1.0, 0.9, 320, list(sampling.stop), 5)
    assert call["lora"] is None

    a, b = fake_adapter(tmp_path / "a"), fake_adapter(tmp_path / "b")
    gen.set_adapter(a)
    gen.generate(prompts, policy_sampling(temperature=0))
    gen.set_adapter(a)  # the same adapter again: same id, vLLM reuses what it loaded
    gen.generate(prompts, dataclasses.replace(sampling, n=1))
    gen.set_adapter(b)
    gen.generate(prompts, dataclasses.replace(sampling, n=1))
    loras = [c["lora"] for c in engine.calls[1:]]
    assert [(r.lora_int_id, r.lora_path) for r in loras] == [(1, str(a)), (1, str(a)), (2, str(b))]
    assert len({r.lora_name for r in loras}) == 2
    assert engine.calls[1]["params"].top_p == 1.0 and engine.calls[1]["params"].temperature == 0  # greedy
    gen.set_adapter(None)
    assert gen.lora_request is None
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        gen.set_adapter(tmp_path / "missing")


def test_generator_rejects_a_short_answer_from_the_engine(tmp_path, world):
    tok = build_tokenizer(tmp_path / "tok", world_corpus(world))
    pools = pools_for(world)

    class Short(FakeEngine):
        def generate(self, prompts, sampling_params=None, **kw):
            return super().generate(prompts, sampling_params, **kw)[:-1]

    gen = VLLMGenerator("base-model", tok, engine=Short(tok, pools), types=FAKE_TYPES)
    with pytest.raises(RuntimeError, match="2 prompts"):
        gen.generate(list(pools)[:2], policy_sampling(n=2))


@pytest.mark.parametrize("style", ["auto", "chat", "plain"])
def test_item6_vllm_generator_stops_at_a_chat_frames_turn_end(style):
    """#34 item 6: in a chat frame `<end_of_turn>` is a stop token id of the sampling parameters (no
    stop string can see it: they are matched on text decoded with special tokens skipped); a plain
    frame has no turn end and sends none."""
    tok = build_chat_tokenizer()
    prompt = "# how many circles?\ndef execute_command(image) -> str:"
    framed = tok.decode(encode_prompt(frame_prompt(prompt, tok, style), tok), skip_special_tokens=True)
    engine = FakeEngine(tok, {framed: ["\n    return '1'"]})
    gen = VLLMGenerator("base-model", tok, style=style, engine=engine, types=FAKE_TYPES, use_tqdm=False)
    assert gen.generate([prompt], policy_sampling(n=2)) == [["\n    return '1'"] * 2]
    sent = engine.calls[0]["params"].stop_token_ids
    assert sent == (None if style == "plain" else [tok.convert_tokens_to_ids("<end_of_turn>")])


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_missing_vllm_is_a_clear_error(tmp_path, world):
    tok = build_tokenizer(tmp_path / "tok", world_corpus(world))
    gen = VLLMGenerator("base-model", tok)
    with pytest.raises(ImportError, match="needs vLLM"):
        gen.generate([prompt_for("What color is the circle?")], policy_sampling())
    with pytest.raises(ImportError, match="needs vLLM"):
        gen.set_adapter(fake_adapter(tmp_path / "a"))


def test_rest_loop_serves_each_iterations_adapter_to_one_engine(tmp_path, world):
    """The ReST loop through `VLLMGenerator` (fake engine): iteration 0 samples with the initial
    adapter, iteration 1 with iteration 0's, on the same engine with a new LoRA id."""
    items = [(e, prompt_for(e.query)) for e in world[1]]
    model, tok = build_policy(tmp_path / "policy", world_corpus(world))
    engine = FakeEngine(tok, pools_for(world))
    gen = VLLMGenerator(str(tmp_path / "policy"), tok, engine=engine, types=FAKE_TYPES, use_tqdm=False)
    run_dir = tmp_path / "run"
    rest = RestArgs(rest_iterations=2)
    sft = sft_args(tmp_path, per_device_train_batch_size=2, seed=1)
    with oracle_scorer(world[0]) as scorer:
        paths = run_rest(
            model=model, tokenizer=tok, items=items, scorer=scorer, generator=gen, rest=rest, sft=sft,
            sampling=SamplingArgs(num_generations=4),
            style="auto", run_dir=run_dir, log=RolloutLog.in_run(run_dir),
            prompt_hash="ph", policy_name="tiny",
        )  # fmt: skip
    assert [(c["lora"].lora_int_id, c["lora"].lora_path) for c in engine.calls] == [
        (1, str(initial_adapter_dir(run_dir).resolve())),
        (2, str(adapter_dir(run_dir, 0).resolve())),
    ]
    assert [c["params"].seed for c in engine.calls] == [1, 2] and all(c["params"].n == 4 for c in engine.calls)
    assert gen.lora_request.lora_path == str(paths[-1].resolve())  # ready for evaluation with the last adapter
    rows = RolloutLog.in_run(run_dir).read()
    assert [sum(r.step == k for r in rows) for k in (0, 1)] == [12, 12] and sum(r.total == 1.0 for r in rows) == 6


@pytest.mark.vllm
@pytest.mark.gpu
def test_real_vllm_engine_samples_with_a_lora_adapter(tmp_path, world):
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("vLLM needs a CUDA device")
    # head_dim 64: vLLM's attention backends do not take the tiny default's 16
    model, tok = build_policy(tmp_path / "policy", world_corpus(world), hidden=128, heads=2)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    model.save_pretrained(str(tmp_path / "adapter"))
    gen = VLLMGenerator(
        str(tmp_path / "policy"),
        tok,
        max_lora_rank=8,
        engine_kwargs={"gpu_memory_utilization": 0.2, "max_model_len": 512, "enforce_eager": True},
    )
    prompts = [prompt_for(e.query) for e in world[1][:2]]
    gen.set_adapter(tmp_path / "adapter")
    out = gen.generate(prompts, policy_sampling(n=2, max_new_tokens=16, seed=0))
    assert len(out) == 2 and all(len(o) == 2 and all(isinstance(t, str) for t in o) for o in out)
    gen.close()
