"""How far do trl's vLLM weight syncs move a bf16 base under LoRA? Prints figures; asserts nothing.

    python bench/lora_merge_drift.py [--syncs 256] [--width 4096] [--rank 16] [--alpha 32] [--lr 2e-4]

One Llama-7B-shaped projection (`q_proj`, width x width, bf16, init std 0.02) with a LoRA adapter
as `vprl.train.policy.loading` makes it (float32 adapter weights, r 16, alpha 32). The adapter is trained
with Adam to move the layer towards a rank-r target (the loss reads the adapter's path alone, so a
step costs little on a CPU), and after every optimizer step the same adapter is synced from two
copies of the layer:

* trl (`VLLMGeneration._iter_named_params`, the plain PEFT path): `merge_adapter()`, read the
  weights, `unmerge_adapter()`, in place on the bf16 base;
* `vprl.train.online.weight_sync.merged_weight`: `W + scale·B·A` in float32, rounded once, out of place.

At each checkpoint it prints, for each: the share of base weights that are no longer the
checkpoint's, the largest change, the change's Frobenius norm relative to the base and relative to
the adapter's own update (`scale·B·A`), and how far the weights handed to vLLM are from the exact
merge of the checkpoint's base and the adapter, in bf16 units of the last place.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from vprl.train.online.weight_sync import merged_weight


class Projection(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(width, width, bias=False)  # never called: the bench trains the adapter alone


def build(width: int, rank: int, alpha: int, seed: int):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = Projection(width)
    nn.init.normal_(base.q_proj.weight, std=0.02)
    base = base.to(torch.bfloat16)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=["q_proj"])
    return get_peft_model(base, config)  # the adapter in float32 (peft's autocast_adapter_dtype)


def layer_of(model):
    return model.base_model.model.q_proj


def update(layer) -> torch.Tensor:
    """The adapter's update `scale·B·A` in float64."""
    a, b = layer.lora_A["default"].weight.double(), layer.lora_B["default"].weight.double()
    return (b @ a) * layer.scaling["default"]


def ulps(sent: torch.Tensor, exact: torch.Tensor) -> float:
    """Mean distance in bf16 units of the last place at each element's magnitude."""
    spacing = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(2**-126))) - 7)
    return float(((sent.double() - exact).abs() / spacing).mean())


def figures(label: str, base0: torch.Tensor, layer, sent: torch.Tensor) -> str:
    moved = layer.get_base_layer().weight.detach().double() - base0.double()
    delta = update(layer)
    exact = base0.double() + delta
    return (
        f"  {label:<10} changed {float((moved != 0).double().mean()):8.4%}  max {float(moved.abs().max()):.2e}  "
        f"|dW|/|W| {float(moved.norm() / base0.double().norm()):.2e}  |dW|/|sBA| "
        f"{float(moved.norm() / delta.norm().clamp_min(1e-30)):.3f}  sent-exact {ulps(sent, exact):.3f} ulp"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--syncs", type=int, default=256, help="optimizer steps, each followed by one sync")
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--tokens", type=int, default=64, help="rows of the regression batch")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_grad_enabled(True)

    trl_model = build(args.width, args.rank, args.alpha, args.seed)
    ours_model = build(args.width, args.rank, args.alpha, args.seed)
    trl_layer, ours_layer = layer_of(trl_model), layer_of(ours_model)
    base0 = trl_layer.get_base_layer().weight.detach().clone()
    gen = torch.Generator().manual_seed(args.seed + 1)
    target = torch.randn(args.width, args.rank, generator=gen) @ torch.randn(args.rank, args.width, generator=gen)
    target *= 0.02 / args.rank**0.5  # a rank-r change about as large as the base's own weights
    lora = [trl_layer.lora_A["default"].weight, trl_layer.lora_B["default"].weight]
    optimizer = torch.optim.Adam(lora, lr=args.lr)
    scale = trl_layer.scaling["default"]
    checkpoints = sorted({c for c in (1, 10, 50, 100, 256, 1000, args.syncs) if c <= args.syncs})
    print(
        f"q_proj {args.width}x{args.width} bf16, LoRA r {args.rank} alpha {args.alpha} (float32 adapter), "
        f"Adam lr {args.lr:g}, {args.tokens} rows a step; torch {torch.__version__}"
    )
    start = time.perf_counter()
    for step in range(1, args.syncs + 1):
        x = torch.randn(args.tokens, args.width, generator=gen)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss((x @ lora[0].T) @ lora[1].T * scale, x @ target.T)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            for name in ("lora_A", "lora_B"):
                getattr(ours_layer, name)["default"].weight.copy_(getattr(trl_layer, name)["default"].weight)
            trl_model.merge_adapter()  # what trl's sync does with a plain PEFT policy
            trl_sent = trl_layer.get_base_layer().weight.detach().clone()
            trl_model.unmerge_adapter()
            ours_sent = merged_weight(ours_layer)
            if step in checkpoints:
                print(f"after {step} syncs ({time.perf_counter() - start:.0f} s, loss {float(loss):.3e})")
                print(figures("trl", base0, trl_layer, trl_sent))
                print(figures("out-place", base0, ours_layer, ours_sent))


if __name__ == "__main__":
    main()
