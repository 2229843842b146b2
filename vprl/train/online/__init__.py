"""GRPO and RLOO through trl's trainers: the trainer classes with program stops, zero-variance
groups and overlapped execution (`trainers`), the run-folder callbacks (`callbacks`), building and
running the trainer from the recipe (`run`)."""
