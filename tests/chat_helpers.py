"""A Gemma-like chat tokenizer (`<start_of_turn>`/`<end_of_turn>` special tokens and a chat template)
and a tiny policy that draws `<end_of_turn>` now and then, mid-completion (#34 item 6): shared by
the trainer's tests (tests/test_chat_turn_end.py) and the samplers' (tests/test_sampling_turn_end.py)."""

from __future__ import annotations

import torch

from vprl.train.policy.tiny import TinyModelConfig, build_model, train_tokenizer

GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
TEXTS = ["# how many circles?\ndef execute_command(image) -> str:\n    return str(len(image.find('circle')))\n"] * 4
SIZES = TinyModelConfig(vocab_size=320, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def build_chat_tokenizer():
    tok = train_tokenizer(TEXTS, vocab_size=320, context=256)
    tok.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    tok.chat_template = GEMMA_TEMPLATE
    return tok


def build_turn_end_policy(tokenizer, seed: int = 0):
    """A tiny random policy whose LM head favours `<end_of_turn>` (a bias of 3.5 on it): drawn now
    and then, mid-completion, so what it writes after the turn end can be looked for."""
    model = build_model(tokenizer, SIZES, seed=seed)
    eot = tokenizer.convert_tokens_to_ids("<end_of_turn>")
    head = torch.nn.Linear(SIZES.hidden_size, len(tokenizer), bias=True)
    head.weight = model.lm_head.weight
    with torch.no_grad():
        head.bias.zero_()
        head.bias[eot] = 3.5
    model.lm_head = head
    return model
