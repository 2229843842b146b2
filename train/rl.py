"""`accelerate launch train/rl.py --config configs/X.yaml [--key value ...]` from a checkout.

The design card (and open-r1, whose layout it follows) writes the command with `train/rl.py`; the
trainer lives in the package, `vprl/train/rl.py`. This file runs that module exactly as
`accelerate launch vprl/train/rl.py` or `python -m vprl.train.rl` does, so the card's command works
as written. It is not part of the distribution (pyproject.toml packages `vprl*` only), so a user's
own `train` package still wins over it once vprl is installed.
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("vprl.train.rl", run_name="__main__", alter_sys=True)
