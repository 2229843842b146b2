"""The policy model: loading a causal code LM with its LoRA adapter, 4-bit when asked (`loading`),
and the tiny Llama with its locally trained tokenizer (`tiny`)."""
