"""`python -m vprl.train.export`: the command of `vprl.train.export.adapter`."""

import sys

from vprl.train.export.adapter import main

if __name__ == "__main__":
    sys.exit(main())
