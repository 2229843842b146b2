"""ACEs, automatically generated in-context examples: mined from a run (`from_run`) or by Stanić
et al.'s zero-shot procedure (`stanic`), written as an ICE file with a preview (`output`).
Command: `python -m vprl.train.ace from-run | stanic`."""
