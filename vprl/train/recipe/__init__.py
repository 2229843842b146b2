"""The recipe: config parsing for every command (`parsing`), the RL recipe's sections and trainer
arguments (`sections`, `trainer_args`, `rl_config`), its checks before any work (`checks`), and the
examples and prompts it names (`data`)."""
