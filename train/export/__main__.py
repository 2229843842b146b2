"""`python -m train.export`: the command of `train.export.adapter`."""

import sys

from train.export.adapter import main

if __name__ == "__main__":
    sys.exit(main())
