"""How a sandbox's end becomes a status, and cleaning of the plain data it sent."""

from __future__ import annotations

import signal
from typing import Any


def classify_exit(code: int, ready: bool) -> tuple[str, str]:
    """Status of a sandbox that ended without a result, from the exit code of its tree's top process."""
    if not ready:
        return "infra_error", f"sandbox set-up failed (exit code {code})"
    if code > 128 or code < 0:
        sig = code - 128 if code > 128 else -code
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        if sig == signal.SIGXCPU:
            return "timeout", "the program used up its CPU time"
        return "killed", f"the program was killed by {name}"
    return "killed", f"the program exited (code {code}) without returning a result"


def clean_text(s: str) -> str:
    return s if s.isascii() else s.encode("utf-8", "replace").decode("utf-8")


def clean(value: Any) -> Any:
    """Replace lone surrogates in strings of plain data (they cannot be written as UTF-8)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, dict):
        return {clean_text(k): clean(v) for k, v in value.items()}
    return value
