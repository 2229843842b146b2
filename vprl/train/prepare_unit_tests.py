"""Write and draw the visual unit tests of a recipe's training questions before training:
`python -m vprl.train.prepare_unit_tests --config configs/X.yaml [--key value ...]`.

ViUniT's tests depend on the question only (with the query-only writer), so they can all be made in
one pass: the test writer (an 8B LLM) and the image generator (SDXL) use the GPU here, and the RL
run that follows finds every test and image in `<output_dir>/unit_test_cache` and never loads
either model, which leaves their memory to the policy and the vision tools (docs/distributed.md).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from vprl.rewards.unit_tests.reward import unit_tests_reward
from vprl.train.recipe.checks import validate
from vprl.train.recipe.parsing import ConfigError, run_command
from vprl.train.recipe.rl_config import parse_rl_config


def main(argv: list[str] | None = None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = sys.argv[1:] if argv is None else argv
    if "-h" in args or "--help" in args:
        # It reads the RL recipe whole, but never trains: its help leaves the trainer's keys out.
        from vprl.train.recipe.parsing import parse_config
        from vprl.train.recipe.rl_config import SECTIONS

        description = __doc__.split("\n\n")[0] + " Reads the RL recipe; its trainer keys are accepted and ignored."
        parse_config(
            list(SECTIONS.values()),
            ["--help"],
            prog="python -m vprl.train.prepare_unit_tests",
            description=description,
        )
    cfg = parse_rl_config(argv, prog="python -m vprl.train.prepare_unit_tests", description=__doc__.split("\n\n")[0])
    checked = validate(cfg, check_layout=False)  # the RL run's layout is not this command's
    specs = [spec for spec in checked.rewards.rewards if spec.name == "unit_tests"]
    if not specs:
        raise ConfigError("rewards: the recipe has no unit_tests reward; there is nothing to prepare")
    run_dir = Path(cfg.training.output_dir)
    # No programs run here, so no executor: the runner is only needed by evaluate().
    reward = unit_tests_reward(**specs[0].settings, runner=_NO_RUNNER, run_dir=str(run_dir))
    summary = reward.prepare([ex.query for ex in checked.examples])
    print(json.dumps(summary, indent=2))
    print(f"prepare_unit_tests: cache in {reward.config.cache_dir}")
    return summary


class _NoRunner:
    def run(self, *args, **kwargs):
        raise RuntimeError("prepare_unit_tests runs no program")


_NO_RUNNER = _NoRunner()

if __name__ == "__main__":
    run_command(main)
