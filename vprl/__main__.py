"""`python -m vprl COMMAND [options]`: the `vprl` command without its console script (`vprl.cli`)."""

import sys

from vprl.cli import main

sys.exit(main())
