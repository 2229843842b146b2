"""#34 item 6 in the offline samplers (ReST and evaluation): a chat frame's turn end (CodeGemma's
`<end_of_turn>`) ends a completion sampled with transformers' generate, and nothing the policy would
write after it reaches the returned text. The vLLM sampler's side is in tests/test_vllm_generation.py."""

from __future__ import annotations

import pytest
import torch
from chat_helpers import build_chat_tokenizer, build_turn_end_policy

from vprl.train.prompts import encode_prompt, frame_prompt
from vprl.train.sampling.generator import cut_at_stop, policy_sampling
from vprl.train.sampling.hf import HFGenerator

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = "# how many circles?\ndef execute_command(image) -> str:"


class Recording:
    """The policy with its `generate` outputs recorded, so the test sees where generation stopped."""

    def __init__(self, model):
        self.model, self.outputs, self.kwargs = model, [], []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def generate(self, **kwargs):
        out = self.model.generate(**kwargs)
        self.outputs.append(out)
        self.kwargs.append(kwargs)
        return out


def test_item6_hf_generator_stops_at_the_turn_end_and_returns_nothing_after_it():
    tok = build_chat_tokenizer()
    model = build_turn_end_policy(tok)
    eot = tok.convert_tokens_to_ids("<end_of_turn>")
    sampling = policy_sampling(n=16, max_new_tokens=24, seed=3, stop=())
    eos_before = model.generation_config.eos_token_id

    # What the policy writes after the turn end when nothing stops it there: the same draws, same seed.
    ids = torch.tensor([encode_prompt(frame_prompt(PROMPT, tok), tok)] * sampling.n)
    torch.manual_seed(sampling.seed)
    model.eval()
    with torch.no_grad():
        unstopped = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=sampling.max_new_tokens,
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=None,
            pad_token_id=tok.pad_token_id,
        )[:, ids.size(1) :].tolist()
    runs_on = [
        (row.index(eot), tok.decode(row[row.index(eot) + 1 :], skip_special_tokens=True))
        for row in unstopped
        if eot in row
    ]
    assert any(after.strip() for _, after in runs_on)  # the policy does write an invented next turn

    policy = Recording(model)
    texts = HFGenerator(policy, tok, batch_size=sampling.n).generate([PROMPT], sampling)[0]

    generated = policy.outputs[0][:, ids.size(1) :].tolist()
    ended_at_turn = 0
    for row, text, reference in zip(generated, texts, unstopped, strict=True):
        if eot not in reference:
            assert row == reference[: len(row)]
            continue
        ended_at_turn += 1
        at = reference.index(eot)
        assert row[: at + 1] == reference[: at + 1]  # the same draws up to the turn end
        assert set(row[at + 1 :]) <= {tok.pad_token_id}, row  # and generation stopped there
        # Exactly what came before the turn end: the invented next turn is not in the text.
        assert text == cut_at_stop(tok.decode(reference[:at], skip_special_tokens=True), sampling.stop)
    assert ended_at_turn > 0
    assert model.generation_config.eos_token_id == eos_before  # the policy's own config is left as it was
