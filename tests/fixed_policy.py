"""A policy whose every completion is one program, fixed by construction, for the tests whose verdict
needs programs that run.

A briefly fitted tiny policy (`rl_tiny.build_policy`) samples whatever its weights, and so the CPU's
kernels, make likely: on an AVX-512 machine the same fitting writes no program that runs, where an
AVX2 machine's writes many. This one cannot drift: the program's text is one added token of the
tokenizer, the transformer layers add nothing to the residual stream, and the head gives that token
(after any other token) and then EOS (after it) a logit thousands above every other token's, so that
sampling at any temperature near 1 picks them whatever rounding a kernel does.
"""

from __future__ import annotations

from pathlib import Path

MARGIN = 1000.0  # softmax of a logit this far ahead is exactly 1 in float32: exp(-1000) underflows


def build_fixed_policy(out: Path, world: Path, body: str = "\n    return 'yes'\n") -> Path:
    """A model folder (Llama and tokenizer) that answers every prompt with `body` and then EOS."""
    import torch
    from tokenizers import AddedToken
    from transformers import LlamaConfig, LlamaForCausalLM

    from vprl.data.shapes.tasks import load_shapes_tasks
    from vprl.train.policy.tiny import train_tokenizer
    from vprl.train.prompts import PromptConfig, PromptTemplate

    template = PromptTemplate.from_config(PromptConfig(layout="bare"))
    queries = [ex.query for examples in load_shapes_tasks(world).values() for ex in examples]
    tokenizer = train_tokenizer([template.build(q) for q in queries] * 2, vocab_size=400, context=1024)
    tokenizer.add_tokens([AddedToken(body, normalized=False, special=False)])
    program = tokenizer.convert_tokens_to_ids(body)
    width = 8
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=width,
        intermediate_size=width,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,  # the head reads a token's successor, the embedding says which token it is
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream stays the current token's embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = model.model.embed_tokens.weight
        embed.zero_()
        embed[:, 0] = 1.0  # every token but the program's: "the program comes next"
        embed[program] = 0.0
        embed[program, 1] = 1.0  # the program's token: "EOS comes next"
        head = model.lm_head.weight
        head.zero_()
        head[program, 0] = MARGIN
        head[tokenizer.eos_token_id, 1] = MARGIN
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out
