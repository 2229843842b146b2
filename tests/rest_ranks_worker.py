"""One process of tests/test_rest_ranks.py's ReST run under `accelerate launch --num_processes 2`.

Every process builds the same tiny policy, runs its own sandboxed executor with the oracle tools and a
`PoolGenerator` (tests/rest_helpers.py), and calls `run_rest` as `vprl.train.rest.run` does. It records what
it sampled, what it trained on (the SFT examples handed to the trainer) and its adapter weights at the
end, in `<out>/rank-<i>.json`, for the test to compare across processes.

    accelerate launch ... tests/rest_ranks_worker.py WORLD_ROOT OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from rest_helpers import PoolGenerator, build_policy, lora_sum, oracle_scorer, pools_for, prompt_for, sft_args

from vprl.data.shapes import load_gold_programs
from vprl.data.shapes.tasks import load_shapes_tasks
from vprl.train.recipe.sections import RestArgs, SamplingArgs
from vprl.train.rest import loop
from vprl.train.rest.sft import sft_state
from vprl.train.rollouts.log import RolloutLog


def main(world_root: Path, out: Path) -> None:
    torch.set_num_threads(1)
    examples = load_shapes_tasks(world_root, ["train"])["train"][:3]
    gold = load_gold_programs(world_root)["vqa"]
    world = (world_root, examples, [gold[e.query] for e in examples])
    items = [(e, prompt_for(e.query)) for e in examples]
    sft = sft_args(out / "sft", num_train_epochs=2, per_device_train_batch_size=1, learning_rate=2e-2, seed=7)
    rank = sft_state(sft, out).process_index
    torch.manual_seed(0)  # the same LoRA initialisation in every process
    corpus = [prompt_for(e.query) for e in examples] + world[2]
    model, tok = build_policy(out / f"policy-{rank}", corpus)
    generator = PoolGenerator(pools_for(world))

    trained: list[list[list[int]]] = []
    train_sft = loop.train_sft

    def recording_train_sft(model, tokenizer, rows, *args, **kwargs):
        trained.append([row["input_ids"] for row in rows])
        return train_sft(model, tokenizer, rows, *args, **kwargs)

    loop.train_sft = recording_train_sft
    run_dir = out / "run"
    with oracle_scorer(world_root) as scorer:
        loop.run_rest(
            model=model, tokenizer=tok, items=items, scorer=scorer, generator=generator,
            rest=RestArgs(rest_iterations=1), sft=sft,
            sampling=SamplingArgs(num_generations=4, max_completion_length=16),
            style="auto", run_dir=run_dir, log=RolloutLog.in_run(run_dir), prompt_hash="ph", policy_name="tiny",
        )  # fmt: skip
    record = {
        "sampled": [prompt for prompts, _, _ in generator.calls for prompt in prompts],
        "trained": trained,
        "lora_sum": lora_sum(model),
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(record), encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
