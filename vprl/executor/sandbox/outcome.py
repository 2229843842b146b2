"""How a sandbox's end becomes a status, and cleaning of the plain data it sent."""

from __future__ import annotations

import signal
from typing import Any

SETUP_FAILED = "sandbox set-up failed: "  # how a child's last line before "ready" begins (child._setup_failed)


def setup_reason(output: bytes) -> str | None:
    """The reason a sandbox gave for failing its set-up: its last line that begins so, if any."""
    lines = [line for line in output.decode("utf-8", "replace").splitlines() if line.startswith(SETUP_FAILED)]
    return lines[-1][len(SETUP_FAILED) :] if lines else None


def classify_exit(code: int, ready: bool, output: bytes = b"") -> tuple[str, str]:
    """Status of a sandbox that ended without a result, from the exit code of its tree's top process
    (and, before "ready", the reason it wrote to its output)."""
    if not ready:
        reason = setup_reason(output)
        return "infra_error", f"sandbox set-up failed (exit code {code})" + (f": {reason}" if reason else "")
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
