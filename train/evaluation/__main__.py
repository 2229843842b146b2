"""`python -m train.evaluation`: the command of `train.evaluation.pipeline`."""

from train.evaluation.pipeline import main

if __name__ == "__main__":
    main()
