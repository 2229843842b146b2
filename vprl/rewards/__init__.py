"""Reward modules: correctness, visual unit tests, verifiers and their composition."""
