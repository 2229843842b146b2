"""The tiny code policy of the embedded default, bootstrapped by supervised training on gold and
plausibly wrong shapes-world programs (`fit`), and measured (`check`). Command: `python -m vprl.train.bootstrap`."""
