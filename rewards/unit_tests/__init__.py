"""ViUniT's visual unit tests: an LLM writes (image description, expected answer) pairs for a query,
a sampler keeps k of them, an image generator renders each description, and a program's score is
how it answers on those images. Label-free: no ground truth for the real image is needed.
"""
