"""Training: prompts, generation, RL entry point, ReST loop, export, ACEs and evaluation."""
