"""How a language model samples text: one settings record for every model the toolkit samples from
(the policy writing programs, the unit-test writer and the layout planner), validated once."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class SamplingSettings:
    """`n` replies per prompt; temperature 0 is greedy decoding. `stop`: generation ends at the first
    of these strings. `seed`: None leaves the random state as it is."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k filter (both transformers and vLLM read 0 that way)
    max_new_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"sampling: n (replies per prompt) must be a positive integer, got {self.n!r}")
        if self.temperature < 0:
            raise ValueError(f"sampling: temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling: top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"sampling: top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling: max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "stop": list(self.stop)}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> SamplingSettings:
        return cls(**{**row, "stop": tuple(row.get("stop", ()))})


def sampling_fields(config: Any) -> dict[str, Any]:
    """The sampling settings a config holds under `SamplingSettings`' field names."""
    names = [f.name for f in fields(SamplingSettings)]
    return {name: getattr(config, name) for name in names if hasattr(config, name)}
