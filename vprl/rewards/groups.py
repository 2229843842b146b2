"""Groups of samples (the completions of one prompt) and which of them carry a learning signal.

A group whose scorable totals are all equal, or that has fewer than two of them, has nothing to
rank: every advantage in it is zero. GRPO/RLOO log (and may filter) such groups; ReST counts them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

TIE = 1e-9  # totals closer than this are equal (weighted sums of floats)


def is_zero_variance(totals: Sequence[float | None]) -> bool:
    """True when the group's scorable totals (not None, not NaN) are fewer than two or all equal."""
    scored = [t for t in totals if t is not None and not math.isnan(t)]
    return len(scored) < 2 or max(scored) - min(scored) < TIE


def zero_variance_groups(totals: Sequence[float | None], group_size: int) -> list[bool]:
    """`is_zero_variance` for each consecutive group of `group_size` totals."""
    if group_size < 1 or len(totals) % group_size:
        raise ValueError(f"{len(totals)} totals do not split into groups of {group_size}")
    return [is_zero_variance(totals[i : i + group_size]) for i in range(0, len(totals), group_size)]
