"""Evaluation across datasets and inference modes: the plan (`plan`), the papers' inference modes
(`modes`), official metrics (`metrics`), reports and plots (`report`), the whole run (`pipeline`).
Command: `python -m vprl.train.evaluation --config configs/eval/X.yaml`."""
