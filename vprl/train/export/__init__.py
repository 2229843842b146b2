"""Exporting a run's adapter: a clean peft folder with a model card, optionally merged and pushed.
Command: `python -m vprl.train.export --run RUN --out OUT`."""
