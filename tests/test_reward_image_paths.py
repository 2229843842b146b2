"""#37 item 4, the rewards' half: a dataset image path that is not a plain image file (a FIFO, a
device, a folder, a file past the cap) is never read whole and never blocks. The example it belongs
to is masked (`infra_error`, every reward None) with an error naming the example, the path and the
reason, and the batch's other examples score as they would alone."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os

import pytest
from rl_tiny import build_world

from vprl.data.safe_files import MAX_IMAGE_BYTES
from vprl.executor.runner_config import RunnerConfig
from vprl.train.integrations.for_trl import EXAMPLE_COLUMN, load_examples, program_rewards, trl_dataset

PROGRAM = "\n    return 'yes'\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("reward_images") / "world")


def _hostile_paths(folder):
    fifo = folder / "image.fifo"
    os.mkfifo(fifo)
    big = folder / "big.png"
    with open(big, "wb") as fh:  # sparse: past the cap without the disk space
        fh.truncate(MAX_IMAGE_BYTES + 1)
    (folder / "a_folder.png").mkdir()
    return {
        "fifo": (str(fifo), "not a regular file (a FIFO)"),
        "dev_zero": ("/dev/zero", "not a regular file (a character device)"),
        "big": (str(big), "over the cap"),
        "folder": (str(folder / "a_folder.png"), "not a regular file (a folder)"),
    }


@pytest.mark.timeout(120)
def test_item4_hostile_image_paths_are_masked_per_example(world, tmp_path):
    (good,) = load_examples("shapes", str(world), tasks=["train"])[:1]
    hostile = _hostile_paths(tmp_path)
    examples = [good] + [dataclasses.replace(good, id=f"hostile-{name}", image=p) for name, (p, _) in hostile.items()]
    prompts = list(trl_dataset(examples, layout="bare")["prompt"])
    column = [json.dumps(ex.to_json(), sort_keys=True) for ex in examples]
    completions = [PROGRAM] * len(examples)
    with program_rewards({"correctness": 1.0, "executes": 0.5}, runner=RunnerConfig(slots=2)) as rewards:

        async def batch():
            calls = [f(prompts=prompts, completions=completions, **{EXAMPLE_COLUMN: column}) for f in rewards.funcs]
            return await asyncio.wait_for(asyncio.gather(*calls), timeout=60)

        values = asyncio.run(batch())
        scored = rewards.session.score(examples, [PROGRAM.strip()] * len(examples))
    assert [v[0] for v in values][:2] != [None, None]  # the plain example scored
    for i, (name, (path, reason)) in enumerate(hostile.items(), 1):
        assert [v[i] for v in values] == [None, None, None], name  # masked: no reward, no penalty
        result = scored.results[i]
        assert result.status == "infra_error", name
        assert f"hostile-{name}" in result.error and path in result.error and reason in result.error, result.error
