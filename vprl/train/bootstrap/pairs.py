"""The bootstrap's supervised pairs: a prompt and the completion the policy is taught to write."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class SFTPair:
    example_id: str
    family: str
    kind: str  # "gold", a mutation kind, or "repair:<kind of wrong program>"
    prompt: str
    completion: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def body(program: str) -> str:
    """The completion a bare prompt expects: the program after its `def` line."""
    head, sep, rest = program.partition("\n")
    if not head.startswith("def execute_command") or not sep:
        raise ValueError(f"not a one-function program starting with its def line:\n{program}")
    return "\n" + rest if rest.endswith("\n") else "\n" + rest + "\n"
