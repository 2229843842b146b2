"""The LLM test writer ("llm") end to end on CPU: tiny Llama checkpoints built here, a fake vLLM engine."""

from __future__ import annotations

import sys
import types
from collections import Counter
from types import SimpleNamespace

import pytest
import tiny_models as tiny

from vprl.executor.tools.hf.sampling import SamplingSettings
from vprl.rewards.unit_tests.llm_backends import HFBackend
from vprl.rewards.unit_tests.llm_writer import LlmTestWriter, LlmWriterConfig, cut_reply, llm_writer
from vprl.rewards.unit_tests.parsing import UnitTest
from vprl.rewards.unit_tests.protocols import build_writer, writer_names

QUERY = "Is there a red car?"
# What the trained tiny model learns to answer: a duplicate and a too-long answer the writer must drop.
REPLY = (
    '1. Image Caption: "a red car" Answer: yes\n'
    '2. Image Caption: "a blue car" Answer: no\n'
    '3. Image Caption: "a red car" Answer: yes\n'
    '4. Image Caption: "a cat" Answer: there is no car at all\n'
)
EXPECTED = [UnitTest("a red car", "yes"), UnitTest("a blue car", "no")]
PROGRAM = 'def execute_command(image):\n    return bool_to_yesno(ImagePatch(image).exists("red car"))\n'


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def random_lm(tmp_path_factory) -> str:
    return tiny.build("causal_lm", tmp_path_factory.mktemp("random_lm"))


@pytest.fixture(scope="module")
def trained_lm(tmp_path_factory, random_lm) -> tuple[str, str]:
    """The tiny Llama fine-tuned to answer a short prompt with REPLY; returns (checkpoint, template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("trained_lm")
    template = root / "prompt.txt"
    template.write_text("Query: <QUERY>\nTests:\n")
    tok = AutoTokenizer.from_pretrained(random_lm)
    model = AutoModelForCausalLM.from_pretrained(random_lm)
    prompt = f"Query: {QUERY}\nTests:\n"
    ids = tok(prompt + REPLY, return_tensors="pt")["input_ids"]
    ids = torch.cat([ids, torch.tensor([[tok.eos_token_id]])], dim=1)
    labels = ids.clone()
    labels[:, : len(tok(prompt)["input_ids"])] = -100  # learn the reply, not the prompt
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(300):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.003:  # low enough that sampling at temperature 0.7 repeats the reply
            break
    assert loss.item() < 0.003, f"the tiny model did not learn the reply (loss {loss.item():.4f})"
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    return str(root / "model"), str(template)


def test_llm_writer_is_registered_and_rejects_bad_settings(random_lm):
    writer = build_writer("llm", model=random_lm)  # nothing is loaded until the first write
    assert isinstance(writer, LlmTestWriter) and writer.config_key.startswith("llm:")
    assert "llm" in writer_names()
    assert writer.write([]) == []
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['temprature'\].*valid settings"):
        build_writer("llm", model=random_lm, temprature=0.5)
    with pytest.raises(ValueError, match="prompt must be one of"):
        llm_writer(model=random_lm, prompt="program_only")
    with pytest.raises(ValueError, match="top_p must be in"):
        llm_writer(model=random_lm, top_p=0.0)
    with pytest.raises(ValueError, match="`model` is required"):
        llm_writer()


def test_random_tiny_lm_gives_no_tests_and_counted_warnings(random_lm):
    """Bad input: garbage replies from random weights give no tests, counted warnings, no crash."""
    writer = build_writer("llm", model=random_lm, num_candidates=2, max_new_tokens=16, device="cpu")
    tests = writer.write([QUERY, "What color is the cup?"])
    assert tests == [[], []]
    assert writer.warnings["unparseable_reply"] == 4  # 2 queries x 2 candidates
    assert writer.warnings["no_tests_for_query"] == 2
    assert writer.replies_generated == 4


def test_trained_tiny_lm_writes_tests_end_to_end(trained_lm):
    """Sampling 3 candidates from a real (tiny, trained) model: parsed, merged, de-duplicated, filtered."""
    model, template = trained_lm
    writer = llm_writer(model=model, template=template, num_candidates=3, max_new_tokens=160, device="cpu")
    (tests,) = writer.write([QUERY])
    assert tests == EXPECTED
    assert writer.warnings["long_answer"] == 3  # the five-plus-word answer, once per candidate
    assert writer.warnings["duplicate"] == 3 + 2 * 2  # once within each reply, then 2 tests x 2 repeated replies
    assert writer.warnings["unparseable_reply"] == 0


def test_sampling_is_seeded_and_greedy_gives_one_reply(random_lm):
    backend = HFBackend(LlmWriterConfig(model=random_lm, device="cpu", batch_size=2))
    prompts = ["Query: a\nTests:\n", "Query: b b b\nTests:\n", "Query: c\nTests:\n"]
    sampled = SamplingSettings(n=2, temperature=1.0, max_new_tokens=8, seed=3)
    first = backend.generate(prompts, sampled)
    assert [len(r) for r in first] == [2, 2, 2]  # 3 prompts over 2 batches, n replies each
    assert backend.generate(prompts, sampled) == first
    greedy = backend.generate(prompts[:1], SamplingSettings(n=3, temperature=0.0, max_new_tokens=8))
    assert len(greedy) == 1 and len(greedy[0]) == 1


def test_prompts_query_only_and_query_program(random_lm):
    vqa = llm_writer(model=random_lm)
    (prompt,) = vqa.prompts([QUERY], [PROGRAM])  # the query-only prompt ignores programs
    assert prompt.rstrip().endswith(f"Query: {QUERY}\nTests:") and "def execute_command" not in prompt
    assert not vqa.sees_program
    itm = llm_writer(model=random_lm, task="itm")
    assert "near misses" in itm.prompts(["Is the drawing of a cat on a mat?"])[0]
    prog = llm_writer(model=random_lm, prompt="query_program")
    assert prog.sees_program
    (prompt,) = prog.prompts([QUERY], ["# Query: Is there a red car?\n" + PROGRAM])
    assert prompt.rstrip().endswith(f"# Query: {QUERY}\n{PROGRAM.rstrip()}\nTests:")
    assert "<QUERY>" not in prompt and "<PROGRAM>" not in prompt
    with pytest.raises(ValueError, match="none were given"):
        prog.write([QUERY])
    with pytest.raises(ValueError, match="2 queries but 1 programs"):
        prog.prompts([QUERY, QUERY], [PROGRAM])
    keys = {w.config_key for w in (vqa, itm, prog, llm_writer(model=random_lm, temperature=1.0))}
    assert len(keys) == 4 and all(random_lm in k for k in keys)


def test_reply_is_cut_where_the_model_starts_a_new_query():
    reply = '1. Image Caption: "a dog" Answer: yes\n\nQuery: Is there a cat?\nTests:\n1. Image Caption: "a cat" Answer: yes'
    assert cut_reply(reply).strip() == '1. Image Caption: "a dog" Answer: yes'


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class FakeTokenizer:
    """Characters as ids; "<s>" is the BOS (id 1), which `add_special_tokens` puts in front; with a
    chat template, a user turn renders as "<s>[INST] ... [/INST]" (BOS included, as Llama's does)."""

    bos_token_id = 1

    def __init__(self, chat_template: str | None = None):
        self.chat_template = chat_template

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return f"<s>[INST] {messages[-1]['content']} [/INST]"

    def __call__(self, text, add_special_tokens=True):
        ids = [self.bos_token_id] if add_special_tokens else []
        while text:
            if text.startswith("<s>"):
                ids.append(self.bos_token_id)
                text = text[3:]
            else:
                ids.append(ord(text[0]) + 2)
                text = text[1:]
        return {"input_ids": ids}

    def decode(self, ids):
        return "".join("<s>" if i == self.bos_token_id else chr(i - 2) for i in ids)


class FakeEngine:
    """Stands in for `vllm.LLM`: answers prompts that name a red car with tests, others with noise."""

    def __init__(self, tokenizer=None, **kwargs):
        self.init_kwargs = kwargs
        self.tokenizer = tokenizer or FakeTokenizer()
        self.calls: list[tuple[list[str], FakeSamplingParams]] = []

    def get_tokenizer(self):
        return self.tokenizer

    def generate(self, prompts, params, use_tqdm=False):
        texts = [self.tokenizer.decode(p["prompt_token_ids"]) for p in prompts]
        self.calls.append((texts, params, [p["prompt_token_ids"] for p in prompts]))
        n = params.kwargs["n"]
        good = '1. Image Caption: "a red car parked on a street" Answer: yes\n2. Image Caption: "a bus" Answer: no'
        replies = [[good if "red car" in p.rsplit("Query:", 1)[1] else "lorem ipsum"] * n for p in texts]
        return [SimpleNamespace(outputs=[SimpleNamespace(text=t) for t in ts]) for ts in replies]


@pytest.fixture()
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.SamplingParams = FakeSamplingParams
    module.LLM = FakeEngine
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


def test_vllm_backend_with_injected_engine(fake_vllm):
    engine = FakeEngine()
    writer = build_writer("llm", model="meta-llama/Meta-Llama-3-8B-Instruct", backend="vllm", engine=engine)
    tests = writer.write([QUERY, "What color is the sky?"])
    assert tests == [[UnitTest("a red car parked on a street", "yes"), UnitTest("a bus", "no")], []]
    assert writer.warnings == Counter(unparseable_reply=3, no_tests_for_query=1, duplicate=4)
    ((prompts, params, _),) = engine.calls
    assert len(prompts) == 2 and QUERY in prompts[0]
    assert params.kwargs == dict(n=3, temperature=0.7, top_p=0.9, top_k=0, max_tokens=512, seed=0,
                                 stop=["\nQuery:", "\n# Query:"])  # fmt: skip


def test_vllm_engine_is_built_lazily_from_settings(fake_vllm):
    writer = llm_writer(model="/ckpt/llama", backend="vllm", dtype="bfloat16", gpu_memory_utilization=0.4)
    assert writer.backend._engine is None  # nothing loaded until the first write
    writer.write([QUERY])
    assert writer.backend.engine.init_kwargs == dict(model="/ckpt/llama", dtype="bfloat16", gpu_memory_utilization=0.4)


@pytest.mark.parametrize("chat_template", [None, "llama-style"])
def test_vllm_writer_sends_token_ids_with_one_bos(fake_vllm, chat_template):
    """Fault: the vLLM writer sent chat-templated text, which already starts with BOS, and vLLM added
    a second one when it tokenized it. Now it sends token ids, encoded as the transformers backend
    encodes them."""
    engine = FakeEngine(FakeTokenizer(chat_template))
    writer = build_writer("llm", model="meta-llama/Meta-Llama-3-8B-Instruct", backend="vllm", engine=engine)
    writer.write([QUERY])
    ((texts, _, ids),) = engine.calls
    assert ids[0].count(FakeTokenizer.bos_token_id) == 1 and ids[0][0] == FakeTokenizer.bos_token_id
    assert (texts[0].startswith("<s>[INST]")) == (chat_template is not None) and QUERY in texts[0]


@pytest.mark.vllm
@pytest.mark.gpu
def test_vllm_real_engine_on_tiny_lm(random_lm):
    pytest.importorskip("vllm")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("vLLM needs a CUDA device")
    writer = llm_writer(
        model=random_lm, backend="vllm", num_candidates=2, max_new_tokens=16, gpu_memory_utilization=0.2
    )
    assert writer.write([QUERY]) == [[]]
    assert writer.warnings["unparseable_reply"] == 2 and writer.replies_generated == 2


def test_writer_on_a_served_model_sends_token_ids_and_groups_the_replies(tmp_path):
    """backend: server — an OpenAI-compatible completions endpoint (`vllm serve`) shared by every
    training process; prompts go as token ids with one BOS, replies come back per prompt."""
    import http.server
    import json as json_
    import threading

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json_.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            n = body["n"]
            good = '1. Image Caption: "a red car parked on a street" Answer: yes'
            choices = [
                {"index": i * n + j, "text": good if i == 0 else "lorem ipsum"}
                for i in range(len(body["prompt"]))
                for j in range(n)
            ]
            data = json_.dumps({"choices": list(reversed(choices))}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        writer = build_writer("llm", model="served-llama", backend="server", base_url=url, num_candidates=2)
        writer.backend._tokenizer = FakeTokenizer("llama-style")
        tests = writer.write([QUERY, "What color is the sky?"])
    finally:
        server.shutdown()
    assert tests == [[UnitTest("a red car parked on a street", "yes")], []]
    ((path, body),) = seen
    assert path == "/v1/completions" and body["model"] == "served-llama" and body["n"] == 2
    assert all(ids.count(FakeTokenizer.bos_token_id) == 1 for ids in body["prompt"])
    with pytest.raises(ValueError, match="backend server needs base_url"):
        build_writer("llm", model="served-llama", backend="server")
