"""Peak memory of the top-k/top-p importance-sampling correction (#34 item 1), before and after.

    python bench/correction_memory.py [--vocab 256000] [--rows 8] [--positions 321] [--old-rows 1]

The correction puts vLLM's log-probabilities, renormalised over what top-k/top-p/min-p kept, back
on the trainer's footing: it needs the kept mass at every completion position. It used to run a
forward of its own over the whole batch, take its fp32 logits and sort them over the vocabulary
(`old`); it now runs inside trl's old-log-probability forward, on the hidden states that forward
makes, projecting and filtering a slice of positions at a time (`new`,
`vprl.train.online.sampler_logprobs.KeptMassProbe`).

How it is measured: each figure comes from a fresh subprocess, which builds a 2-layer Llama of the
given vocabulary (hidden size 64, so the model and its activations are small next to the logits),
runs the backbone once so the high-water mark covers it, then records `ru_maxrss` (the process's
peak resident memory, which torch's CPU allocations count in: large tensors are their own mappings,
handed back when freed) before and after one run of the correction. The difference is the peak the
correction adds. `new` runs the backbone forward with the probe open, which is what trl's pass does;
`old` runs the removed code's forward and full-vocabulary filtering. At 8 x 321 positions and
CodeGemma's 256,000 tokens `old` needs about 22 GiB, so by default it is measured on `--old-rows`
rows and scaled to `--rows` (every tensor it makes is per position); pass `--old-rows 8` on a
machine with the memory to measure it whole. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FILTERS = {"temperature": 1.0, "top_p": 0.9}  # every CodeGemma GRPO recipe's sampling
PROMPT = 16  # prompt tokens: the correction's cost is in the completion positions


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def measure(variant: str, vocab: int, rows: int, positions: int) -> dict:
    """One variant's added peak, in this process (run it in a fresh one)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from vprl.train.online.sampler_logprobs import KeptMassProbe, SamplerFilters, kept_log_mass, slice_positions

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=PROMPT + positions + 1,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    filters = SamplerFilters(**FILTERS)
    ids = torch.randint(0, vocab, (rows, PROMPT + positions))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        model.model(input_ids=ids, attention_mask=mask)  # the backbone's own peak, before the baseline
        before = _peak_bytes()
        if variant == "old":
            logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=positions + 1).logits[:, :-1]
            mass = kept_log_mass(logits, filters)
        else:
            with KeptMassProbe(model, filters, positions) as probe:
                model.model(input_ids=ids, attention_mask=mask)
            mass = probe.mass()
        after = _peak_bytes()
    assert mass.shape == (rows, positions) and bool(mass.isfinite().all())
    return {"added": after - before, "slice": slice_positions(vocab)}


def run_child(variant: str, vocab: int, rows: int, positions: int) -> dict:
    command = [sys.executable, __file__, "--child", variant, f"--vocab={vocab}", f"--rows={rows}"]
    out = subprocess.run([*command, f"--positions={positions}"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=256_000)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--positions", type=int, default=321)
    parser.add_argument("--old-rows", type=int, default=1)
    parser.add_argument("--child", choices=("old", "new"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.vocab, args.rows, args.positions)))
        return
    old = run_child("old", args.vocab, args.old_rows, args.positions)
    new = run_child("new", args.vocab, args.rows, args.positions)
    elements = args.old_rows * args.positions * args.vocab
    old_full = old["added"] * args.rows / args.old_rows
    mib = 2**20
    print(f"correction peak, vocabulary {args.vocab:,}, {args.rows} x {args.positions} positions, {FILTERS}")
    print(f"{'':>6} {'added peak':>14}  how")
    scaled = "" if args.old_rows == args.rows else f", scaled from {args.old_rows} row(s)"
    print(f"{'old':>6} {old_full / mib:>10,.0f} MiB  own forward, whole-batch fp32 logits and sort{scaled}")
    print(f"{'new':>6} {new['added'] / mib:>10,.0f} MiB  in trl's forward, {new['slice']} positions per slice")
    print(f"old: {old['added'] / elements:.1f} bytes per (position x vocabulary) element, measured on {elements:,}")
    print(f"new: {new['added'] / (new['slice'] * args.vocab):.1f} bytes per element of one slice")


if __name__ == "__main__":
    main()
