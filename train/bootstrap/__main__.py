"""`python -m train.bootstrap`: the command of `train.bootstrap.fit`."""

from train.bootstrap.fit import main
from train.recipe.parsing import run_command

if __name__ == "__main__":
    run_command(main)
