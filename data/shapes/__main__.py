"""`python -m data.shapes --out DIR --train N --val N --seed S`: write a shapes-world dataset."""

from __future__ import annotations

import argparse
import time
from dataclasses import fields

from data.shapes.build import BuildConfig, build_dataset


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m data.shapes", description=__doc__)
    defaults = BuildConfig(out="")
    for f in fields(BuildConfig):
        if f.name == "out":
            parser.add_argument("--out", required=True, help="output folder")
        else:
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=int, default=getattr(defaults, f.name))
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    manifest = build_dataset(BuildConfig(**vars(args)))
    seconds = time.perf_counter() - t0
    counts = manifest["counts"]
    print(f"wrote {args.out} in {seconds:.1f}s: " + ", ".join(f"{k}={v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
