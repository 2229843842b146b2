"""The run viewer: a static page of what the programs of a run (or an evaluation) did.

    python -m vprl.train.view RUN_OR_EVAL_FOLDER [--out DIR] [--limit N] [--steps A:B]

Per program: the image with the boxes of every tool call, the program with the line of each call,
the status, answer against gold and the reward components; per group, the G samples of a prompt
side by side with their advantages; for an evaluation, each question under two policies. The page
is one HTML file, a data.js and a folder of pictures: it opens from disk, with nothing fetched.
See docs/view.md.
"""

from vprl.train.view.page import ViewOptions, build_view

__all__ = ["ViewOptions", "build_view"]
