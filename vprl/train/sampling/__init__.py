"""Sampling programs from the policy: the `Generator` protocol and the papers' sampling settings
(`generator`), with transformers (`hf`) or vLLM's offline engine (`vllm_engine`)."""
