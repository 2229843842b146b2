"""Scores responses through verl's own reward code, for tests/test_verl_reward.py, in a subprocess
with verl on PYTHONPATH (verl pins transformers<5.11, so it cannot live in the project's venv).

    python tests/verl_managers.py CASE.json

CASE.json: {"config_dir", "overrides", "tokenizer", "rows" (verl's parquet rows), "responses"}.
Prints one JSON object: for verl 0.9's reward loop (`RewardLoopWorker`, the `naive` manager, the
custom `compute_score` from the recipe), each sample's `reward_score` and `reward_extra_info`; for
the batch reward manager (`compute_score_batch`), the token-level reward tensor's row sums and the
extra info.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer
from verl import DataProto
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.workers.reward_manager.batch import BatchRewardManager


def batch_of(rows: list[dict], responses: list[str], tokenizer) -> DataProto:
    """The tensors and columns verl's agent loop hands the reward code: left-padded prompts,
    right-padded responses, one attention mask over both."""
    prompts = [tokenizer(r["prompt"][0]["content"])["input_ids"] for r in rows]
    answers = [tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for text in responses]
    width_p, width_r = max(map(len, prompts)), max(map(len, answers))
    pad = tokenizer.pad_token_id
    p = torch.tensor([[pad] * (width_p - len(x)) + x for x in prompts])
    r = torch.tensor([x + [pad] * (width_r - len(x)) for x in answers])
    mask = torch.tensor(
        [
            [0] * (width_p - len(x)) + [1] * (len(x) + len(y)) + [0] * (width_r - len(y))
            for x, y in zip(prompts, answers)
        ]
    )
    columns = {
        key: np.array([row[key] for row in rows], dtype=object)
        for key in ("data_source", "reward_model", "extra_info")
    }
    return DataProto.from_dict(
        tensors={"prompts": p, "responses": r, "attention_mask": mask, "input_ids": torch.cat([p, r], 1)},
        non_tensors=columns,
    )


def main(path: str) -> None:
    case = json.loads(Path(path).read_text(encoding="utf-8"))
    with initialize_config_dir(config_dir=case["config_dir"], version_base=None):
        config = compose(config_name="viunit_grpo", overrides=case["overrides"])
    tokenizer = AutoTokenizer.from_pretrained(case["tokenizer"])
    data = batch_of(case["rows"], case["responses"], tokenizer)

    worker = RewardLoopWorker(config)  # what each of verl's reward actors is, without Ray
    loop_out = worker.loop.run_until_complete(worker.compute_score_batch(data))

    config.reward.custom_reward_function.name = "compute_score_batch"
    manager = BatchRewardManager(tokenizer, num_examine=0, compute_score=get_custom_reward_fn(config))
    batch_out = manager(data, return_dict=True)
    extra = {
        k: [v.item() if hasattr(v, "item") else v for v in vs] for k, vs in batch_out["reward_extra_info"].items()
    }
    print(
        json.dumps(
            {
                "loop": [{"score": o["reward_score"], "extra": o["reward_extra_info"]} for o in loop_out],
                "batch": {"sums": batch_out["reward_tensor"].sum(-1).tolist(), "extra": extra},
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
