"""`python -m vprl.data.shapes --out DIR --train N --val N --seed S`: write a shapes-world dataset."""

from __future__ import annotations

import time
from dataclasses import fields

from vprl.data.cli import CommandParser, checked
from vprl.data.ranges import AT_LEAST_ONE, NON_NEGATIVE
from vprl.data.shapes.build import BuildConfig, build_dataset

HELP = {
    "train": "GQA-format questions of the training families, on training images",
    "val": "questions of the training families on new images, and as many of the held-out families",
    "seed": "the world's random seed",
    "winoground": "Winoground-style examples (two images, two captions each)",
    "sugarcrepe": "SugarCREPE-style caption pairs per category",
    "refcoco": "RefCOCO-style images (up to 3 referring expressions each)",
    "questions_per_image": "questions asked about each image",
    "width": "image width in pixels",
    "height": "image height in pixels",
    "workers": "processes that render images",
}


def main(argv: list[str] | None = None) -> None:
    parser = CommandParser(prog="python -m vprl.data.shapes", description=__doc__)
    defaults = BuildConfig(out="unused")
    for f in fields(BuildConfig):
        if f.name == "out":
            parser.add_argument("--out", required=True, help="output folder")
        else:
            text = f"{HELP[f.name]} (default {getattr(defaults, f.name)})"
            parser.add_argument(
                f"--{f.name.replace('_', '-')}",
                type=int,
                default=getattr(defaults, f.name),
                value_range=AT_LEAST_ONE
                if f.name in ("width", "height", "workers", "questions_per_image")
                else NON_NEGATIVE,
                help=text,
            )
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    manifest = build_dataset(checked(BuildConfig, **vars(args)))
    seconds = time.perf_counter() - t0
    counts = manifest["counts"]
    print(f"wrote {args.out} in {seconds:.1f}s: " + ", ".join(f"{k}={v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
