"""ViUniT's visual unit tests: an LLM writes (image description, expected answer) pairs for a query,
a sampler keeps k of them, an image generator renders each description, and a program's score is
how it answers on those images. Label-free: no ground truth for the real image is needed.

Modules: `parsing` (UnitTest, reply parsing), `sampler` (Algorithm 1), `scoring` (h, H, modes),
`protocols` (writer/generator registries), `rule_writer` + `scene_text` (the shapes world's
rule-based writer), `layout` (the shapes world's layout-path generator), `cache` (tests and images
by content, on disk), `reward` (the "unit_tests" reward).
"""
