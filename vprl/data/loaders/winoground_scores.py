"""Winoground's text, image and group scores from per-pairing scores.

For one Winoground example with captions c0, c1 and images i0, i1, and a score s(c, i) for each
of the four pairings (a matching probability, a similarity, or 1/0 for a yes/no answer):

* text score: for each image the matching caption scores higher,
  s(c0, i0) > s(c1, i0) and s(c1, i1) > s(c0, i1);
* image score: for each caption the matching image scores higher,
  s(c0, i0) > s(c0, i1) and s(c1, i1) > s(c1, i0);
* group score: both.

Comparisons are strict, as in the Winoground paper, so ties (e.g. two "yes" answers) count as
wrong. Each dataset-level score is the fraction of examples that pass.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vprl.data.records import Example


@dataclass(frozen=True)
class WinogroundScores:
    text: float
    image: float
    group: float
    n: int
    # Same three fractions (plus "n") per Example.group (Winoground's `tag`).
    per_group: dict[str, dict[str, float]] = field(default_factory=dict)
    # winoground id -> {"text": bool, "image": bool, "group": bool}
    per_example: dict[str, dict[str, bool]] = field(default_factory=dict)


def example_scores(s: Mapping[tuple[int, int], float]) -> dict[str, bool]:
    """Text/image/group correctness for one example; `s[(i, j)]` scores image i with caption j."""
    text = s[0, 0] > s[0, 1] and s[1, 1] > s[1, 0]
    image = s[0, 0] > s[1, 0] and s[1, 1] > s[0, 1]
    return {"text": text, "image": image, "group": text and image}


def _fractions(rows: Sequence[dict[str, bool]]) -> dict[str, float]:
    n = len(rows)
    return {k: sum(r[k] for r in rows) / n for k in ("text", "image", "group")} | {"n": float(n)}


def winoground_scores(examples: Sequence[Example], scores: Sequence[float] | Mapping[str, float]) -> WinogroundScores:
    """Aggregate per-item scores for Winoground-style `itm` Examples (as `load_winoground` emits).

    `scores` is either aligned with `examples` or a mapping from Example id to score. Every
    Winoground id must have all four pairings exactly once; anything else is an error naming it.
    """
    if isinstance(scores, Mapping):
        missing = [ex.id for ex in examples if ex.id not in scores]
        if missing:
            raise ValueError(f"no score for {len(missing)} example(s), e.g. {missing[:5]}")
        values = [float(scores[ex.id]) for ex in examples]
    else:
        if len(scores) != len(examples):
            raise ValueError(f"got {len(scores)} scores for {len(examples)} examples")
        values = [float(v) for v in scores]

    by_id: dict[str, dict[tuple[int, int], float]] = defaultdict(dict)
    tags: dict[str, str] = {}
    for ex, value in zip(examples, values):
        try:
            wid, i, j = str(ex.meta["winoground_id"]), int(ex.meta["image_index"]), int(ex.meta["caption_index"])
        except KeyError as err:
            raise ValueError(f"example {ex.id!r}: meta lacks {err.args[0]!r}; is it a Winoground item?") from None
        if (i, j) in by_id[wid]:
            raise ValueError(f"Winoground id {wid}: pairing image {i} / caption {j} appears twice (at {ex.id!r})")
        by_id[wid][i, j] = value
        tags[wid] = ex.group
    if not by_id:
        raise ValueError("no examples to score")

    per_example: dict[str, dict[str, bool]] = {}
    for wid, s in by_id.items():
        absent = sorted({(0, 0), (0, 1), (1, 0), (1, 1)} - set(s))
        if absent:
            raise ValueError(f"Winoground id {wid}: missing pairing(s) (image, caption) {absent}")
        per_example[wid] = example_scores(s)

    grouped: dict[str, list[dict[str, bool]]] = defaultdict(list)
    for wid, row in per_example.items():
        grouped[tags[wid]].append(row)
    total = _fractions(list(per_example.values()))
    return WinogroundScores(
        text=total["text"],
        image=total["image"],
        group=total["group"],
        n=len(per_example),
        per_group={tag: _fractions(rows) for tag, rows in sorted(grouped.items())},
        per_example=per_example,
    )
