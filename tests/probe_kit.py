"""The parts every hostile probe is made of: a probe's row, and the kernel-interface probe K, whose
program returns the errno of a raw call (tests/hostile_probes.py, tests/signal_probes.py)."""

from __future__ import annotations

import errno
from dataclasses import dataclass


@dataclass(frozen=True)
class Probe:
    name: str
    category: str
    body: str  # body of execute_command(image), indented by 4
    allowed: frozenset[str]
    check: object = None  # optional callable(result) -> None


def P(name, category, body, allowed, check=None):
    return Probe(name, category, body.strip("\n"), frozenset(allowed.split()), check)


def answer_is(value):
    def check(result):
        if result.status == "ok":
            assert result.answer == value

    return check


def K(name, body, answer=errno.EPERM):
    """A kernel-interface probe: raw syscalls through ctypes (importable in a sandbox); the filter
    must make each fail with `answer` (the probe returns the errno), and nothing else may happen."""
    prelude = "    import ctypes, os\n    libc = ctypes.CDLL(None, use_errno=True)\n"
    return P(name, "kernel", prelude + body.strip("\n"), "ok", answer_is(answer))


def errno_of(call):
    return f"    r = {call}\n    return ctypes.get_errno() if r == -1 else ['succeeded', r]"
