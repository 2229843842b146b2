"""The two pluggable parts of the unit-test reward: who writes tests, and who draws their images.

Implementations register by name, so a recipe picks them in YAML (`writer: shapes_rules`,
`generator: shapes_layout`) and a GPU run swaps in an LLM writer and a diffusers generator without
touching the reward. Each implementation reports a `config_key`: the caches key tests and images on
it, so changing a model or a setting never reuses stale entries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from PIL import Image

from rewards.unit_tests.parsing import UnitTest


class TestWriter(Protocol):
    """Writes candidate tests for queries, optionally seeing the program (ViUniT's two prompts).

    Returns one list per query (possibly empty: an unparseable reply gives no tests and a counted
    warning in `warnings`, never an exception). Candidates are not yet sampled down to k."""

    config_key: str

    def write(self, queries: Sequence[str], programs: Sequence[str] | None = None) -> list[list[UnitTest]]: ...


class ImageGenerator(Protocol):
    """Renders a test's description into an image. `seed` makes it reproducible; generators with a
    safety checker retry with seed + 1 (up to 10 times) and raise when every try is flagged."""

    config_key: str

    def generate(self, description: str, seed: int) -> Image.Image: ...


WriterFactory = Callable[..., TestWriter]
GeneratorFactory = Callable[..., ImageGenerator]
_WRITERS: dict[str, WriterFactory] = {}
_GENERATORS: dict[str, GeneratorFactory] = {}


def _add(table: dict[str, Any], kind: str, name: str):
    def add(factory):
        if name in table:
            raise ValueError(f"{kind} {name!r} is registered twice")
        table[name] = factory
        return factory

    return add


def register_writer(name: str):
    return _add(_WRITERS, "test writer", name)


def register_generator(name: str):
    return _add(_GENERATORS, "image generator", name)


def build_writer(name: str, **settings: Any) -> TestWriter:
    if name not in _WRITERS:
        raise ValueError(f"unknown test writer {name!r}; registered writers: {sorted(_WRITERS)}")
    return _WRITERS[name](**settings)


def build_generator(name: str, **settings: Any) -> ImageGenerator:
    if name not in _GENERATORS:
        raise ValueError(f"unknown image generator {name!r}; registered generators: {sorted(_GENERATORS)}")
    return _GENERATORS[name](**settings)


def writer_names() -> list[str]:
    return sorted(_WRITERS)


def generator_names() -> list[str]:
    return sorted(_GENERATORS)
