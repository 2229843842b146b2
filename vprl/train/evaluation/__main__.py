"""`python -m vprl.train.evaluation`: the command of `vprl.train.evaluation.pipeline`."""

from vprl.train.evaluation.pipeline import main
from vprl.train.recipe.parsing import run_command

if __name__ == "__main__":
    run_command(main)
