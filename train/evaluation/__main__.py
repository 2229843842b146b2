"""`python -m train.evaluation`: the command of `train.evaluation.pipeline`."""

from train.evaluation.pipeline import main
from train.recipe.parsing import run_command

if __name__ == "__main__":
    run_command(main)
