"""Content-addressed caches of unit tests and their images, on disk, shared by every program,
epoch and run that points at the same `cache_dir`.

- Tests are keyed by the writer's `config_key`, the query, and the program when the writer reads
  it (`sees_program`): in RL the same query comes back with 8 programs a step and every epoch.
- Images are keyed by the generator's `config_key`, the description and the seed, and stored as
  PNG: the executor reads them from there (`Example.image`), and a test image is drawn once ever.

Entries are written to a temporary name and renamed, so concurrent runs sharing a directory never
see half a file. `CacheStats` counts tests written vs reused and images generated vs reused: the
proof that a second scoring of the same programs writes and draws nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from vprl.executor.limits import MAX_ERROR
from vprl.rewards.unit_tests.parsing import UnitTest
from vprl.rewards.unit_tests.protocols import ImageGenerator, TestWriter


@dataclass
class CacheStats:
    tests_written: int = 0  # queries (or query+program pairs) whose tests the writer wrote
    tests_reused: int = 0  # ... whose tests came from the cache
    images_generated: int = 0
    images_reused: int = 0
    warnings: Counter = field(default_factory=Counter)  # writer and generator warnings, by kind

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["warnings"] = dict(self.warnings)
        return out


def content_key(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\x00")
    return h.hexdigest()[:32]


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class UnitTestCache:
    """Tests and images by content. `root=None` uses a private temporary directory that is removed
    when the cache is garbage-collected (images must be files: the executor reads them)."""

    def __init__(self, root: str | Path | None = None):
        if root is None:
            self.root = Path(tempfile.mkdtemp(prefix="vprl-unit-tests-"))
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.root), True)
        else:
            self.root = Path(root)
            self.root.mkdir(parents=True, exist_ok=True)
        self.stats = CacheStats()
        self._tests: dict[str, list[UnitTest]] = {}

    # -- tests -----------------------------------------------------------------------------------
    def _test_path(self, key: str) -> Path:
        return self.root / "tests" / key[:2] / f"{key}.json"

    def tests_for(
        self, writer: TestWriter, queries: Sequence[str], programs: Sequence[str] | None = None
    ) -> list[list[UnitTest]]:
        """Candidate tests per query (and program, if the writer reads programs); the writer is
        called once, on the items no cache holds."""
        sees = bool(getattr(writer, "sees_program", False)) and programs is not None
        items = [(q, p if sees else "") for q, p in zip(queries, programs if sees else [""] * len(queries))]
        keys = [content_key("tests", writer.config_key, q, p) for q, p in items]
        missing: dict[str, tuple[str, str]] = {}
        for key, item in zip(keys, items):
            if key in self._tests or key in missing:
                continue
            loaded = self._load_tests(key, writer.config_key, *item)
            if loaded is None:
                missing[key] = item
            else:
                self._tests[key] = loaded
        self.stats.tests_reused += len(set(keys)) - len(missing)
        if missing:
            before = Counter(getattr(writer, "warnings", Counter()))
            qs = [q for q, _ in missing.values()]
            written = writer.write(qs, [p for _, p in missing.values()] if sees else None)
            if len(written) != len(qs):
                raise ValueError(
                    f"test writer {writer.config_key!r} returned {len(written)} lists for {len(qs)} queries"
                )
            self.stats.warnings.update(Counter(getattr(writer, "warnings", Counter())) - before)
            for (key, (q, p)), tests in zip(missing.items(), written):
                self._tests[key] = list(tests)
                row = {"writer": writer.config_key, "query": q, "program": p, "tests": [t.to_json() for t in tests]}
                _write_atomic(self._test_path(key), json.dumps(row, sort_keys=True).encode())
            self.stats.tests_written += len(missing)
        return [list(self._tests[k]) for k in keys]

    def _load_tests(self, key: str, writer_key: str, query: str, program: str) -> list[UnitTest] | None:
        path = self._test_path(key)
        if not path.is_file():
            return None
        try:
            row = json.loads(path.read_text(encoding="utf-8"))
            if (row["writer"], row["query"], row["program"]) != (writer_key, query, program):
                raise ValueError("entry is for another query")
            return [UnitTest.from_json(t) for t in row["tests"]]
        except (ValueError, KeyError, TypeError):
            # A damaged or colliding entry is rewritten rather than trusted.
            self.stats.warnings["bad_test_cache_entry"] += 1
            return None

    def cached_tests(self, writer: TestWriter, query: str) -> list[UnitTest] | None:
        """A query's candidate tests if a cache entry holds them (read only: the writer is not called)."""
        key = content_key("tests", writer.config_key, query, "")
        return self._tests.get(key) or self._load_tests(key, writer.config_key, query, "")

    def has_image(self, generator: ImageGenerator, description: str, seed: int) -> bool:
        """Whether a description's image, or the record that it cannot be drawn, is cached."""
        path = self.image_path(generator, description, seed)
        return path.is_file() or path.with_suffix(".failed").is_file()

    # -- images ----------------------------------------------------------------------------------
    def image_path(self, generator: ImageGenerator, description: str, seed: int) -> Path:
        key = content_key("image", generator.config_key, description, str(seed))
        return self.root / "images" / key[:2] / f"{key}.png"

    def images_for(
        self, generator: ImageGenerator, descriptions: Sequence[str], seed: int, progress: bool = False
    ) -> dict[str, Path | None]:
        """PNG path per description (None where the generator could not draw it: counted in
        `stats.warnings["image_failed"]`; the failure is cached too, so it is not retried)."""
        out: dict[str, Path | None] = {}
        todo = []
        for d in dict.fromkeys(descriptions):
            path = self.image_path(generator, d, seed)
            if path.is_file():
                out[d] = path
                self.stats.images_reused += 1
            elif path.with_suffix(".failed").is_file():
                out[d] = None
                self.stats.images_reused += 1
            else:
                todo.append((d, path))
        for d, path in tqdm(todo, desc="unit-test images", disable=not progress or not todo, leave=False):
            try:
                image = generator.generate(d, seed)
            except ValueError as exc:  # the generator cannot draw this description (e.g. a LayoutError)
                self.stats.warnings["image_failed"] += 1
                reason = {"description": d, "error": f"{type(exc).__name__}: {exc}"[:MAX_ERROR]}
                _write_atomic(path.with_suffix(".failed"), json.dumps(reason).encode())
                out[d] = None
                continue
            buf = io.BytesIO()
            image.convert("RGB").save(buf, format="PNG", compress_level=1)
            _write_atomic(path, buf.getvalue())
            self.stats.images_generated += 1
            out[d] = path
        return out
