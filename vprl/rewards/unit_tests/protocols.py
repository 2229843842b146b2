"""The two pluggable parts of the unit-test reward: who writes tests, and who draws their images.

Implementations register by name, so a recipe picks them in YAML (`writer: shapes_rules`,
`generator: shapes_layout`) and a GPU run swaps in an LLM writer and a diffusers generator without
touching the reward. Each implementation reports a `config_key`: the caches key tests and images on
it, so changing a model or a setting never reuses stale entries.

`build_writer` / `build_generator` import the built-in implementation modules first (lazily: an
LLM writer or a diffusers generator costs nothing until asked for), so every built-in name resolves
however the caller reached this module.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from PIL import Image

from vprl.rewards.unit_tests.parsing import UnitTest


class TestWriter(Protocol):
    """Writes candidate tests for queries, optionally seeing the program (ViUniT's two prompts).

    Returns one list per query (possibly empty: an unparseable reply gives no tests and a counted
    warning in `warnings`, never an exception). Candidates are not yet sampled down to k.

    `sees_program` says whether the writer reads the programs (ViUniT's query+implementation
    prompt): only then does the reward pass them, and the test cache keys on them. A writer without
    the attribute is taken as query-only."""

    config_key: str
    sees_program: bool
    warnings: Counter

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


# Modules whose import registers built-in writers and generators; the ones not (yet) in the
# checkout are skipped, but one that is there and fails to import fails loudly.
BUILTIN_MODULES = (
    "vprl.rewards.unit_tests.rule_writer",
    "vprl.rewards.unit_tests.layout",
    "vprl.rewards.unit_tests.llm_writer",
    "vprl.rewards.unit_tests.diffusion",
)


def _load_builtin() -> None:
    for module in BUILTIN_MODULES:
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)


def build_writer(name: str, **settings: Any) -> TestWriter:
    _load_builtin()
    if name not in _WRITERS:
        raise ValueError(f"unknown test writer {name!r}; registered writers: {sorted(_WRITERS)}")
    return _construct(_WRITERS[name], "test writer", name, settings)


def build_generator(name: str, **settings: Any) -> ImageGenerator:
    _load_builtin()
    if name not in _GENERATORS:
        raise ValueError(f"unknown image generator {name!r}; registered generators: {sorted(_GENERATORS)}")
    return _construct(_GENERATORS[name], "image generator", name, settings)


def _construct(factory: Callable[..., Any], kind: str, name: str, settings: dict[str, Any]) -> Any:
    try:
        return factory(**settings)
    except TypeError as exc:
        raise ValueError(f"{kind} {name!r}: bad settings {sorted(settings)}: {exc}") from None


def writer_names() -> list[str]:
    _load_builtin()
    return sorted(_WRITERS)


def generator_names() -> list[str]:
    _load_builtin()
    return sorted(_GENERATORS)
