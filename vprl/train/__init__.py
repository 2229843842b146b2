"""Training: prompts, generation, RL entry point, ReST loop, export, ACEs and evaluation."""

from vprl.data.cli import quiet_console

# Every training command imports this package before trl, peft and bitsandbytes: their start-up
# notices are silenced here, once, before they are printed.
quiet_console()
