"""GRPO in a plain trl script with vprl's rewards: the programs run sandboxed against the shapes
world's vision tools and are scored by correctness and visual unit tests.

    python -m vprl.data.shapes --out world
    python examples/trl_grpo.py --model_name_or_path codellama/CodeLlama-7b-Python-hf --world world  [--cpu]
"""

import argparse

from trl import GRPOConfig, GRPOTrainer

from vprl.train.integrations.for_trl import load_examples, program_rewards, trl_dataset

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--model_name_or_path", required=True, help="a causal code LM: hub name or folder")
parser.add_argument("--world", required=True, help="a shapes world (python -m vprl.data.shapes --out DIR)")
parser.add_argument("--out", default="runs/trl_grpo", help="trl's output folder")
parser.add_argument("--prompt_layout", default="stanic", help="prompt layout; bare for a tiny policy")
parser.add_argument("--steps", type=int, default=2, help="optimizer steps")
parser.add_argument("--cpu", action="store_true", help="train on the CPU")
args = parser.parse_args()

dataset = trl_dataset(load_examples("shapes", args.world, tasks=["train"]), layout=args.prompt_layout)
with program_rewards(["correctness", "unit_tests"], tool_stack="shapes") as rewards:
    config = GRPOConfig(
        output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=4, num_generations=4,
        max_completion_length=64, logging_steps=1, report_to="none", use_cpu=args.cpu, reward_weights=rewards.weights,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=args.model_name_or_path, reward_funcs=rewards.funcs, args=config, train_dataset=dataset
    )
    print(trainer.train())
    trainer.save_model()
