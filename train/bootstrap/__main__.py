"""`python -m train.bootstrap`: the command of `train.bootstrap.fit`."""

from train.bootstrap.fit import main

if __name__ == "__main__":
    main()
