"""`python -m vprl.train.bootstrap`: the command of `vprl.train.bootstrap.fit`."""

from vprl.train.bootstrap.fit import main
from vprl.train.recipe.parsing import run_command

if __name__ == "__main__":
    run_command(main)
