"""The visual unit-test reward (ViUniT, [U] D–F; docs/references.md#unit-test-scoring), registered as "unit_tests".

For each program: the candidate tests of its query (written once, cached), k of them sampled
(Algorithm 1), an image per test (drawn once, cached as PNG), the program run on every test image
through the executor, each run scored against the test's expected answer (h, with error
penalties), and the scores aggregated (H) into the reward. No label of the real example is read:
the reward needs the query and the program only.

In RL the same query comes with many programs (8 samples a step) and the same programs recur:
every (program, test image) pair of a call goes to the runner in one batch, and identical pairs
run once.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vprl.data.records import Example
from vprl.executor.limits import MAX_TRACE
from vprl.executor.program import program_key
from vprl.executor.results import ExecutionResult
from vprl.rewards.unit_tests.cache import UnitTestCache
from vprl.rewards.unit_tests.parsing import UnitTest
from vprl.rewards.unit_tests.protocols import ImageGenerator, TestWriter, build_generator, build_writer
from vprl.rewards.unit_tests.sampler import Embedder, hashing_embedder, random_tests, sample_tests
from vprl.rewards.unit_tests.scoring import ScoringConfig, program_score, unit_test_score

# answers then inputs (ViUniT's best) / the same keeping the answers even (ours) / inputs only / random
SAMPLERS = ("coverage", "balanced", "input", "random")
EMBEDDINGS = ("hashing",)


@dataclass(frozen=True)
class UnitTestRewardConfig:
    writer: str = "shapes_rules"
    writer_settings: dict[str, Any] = field(default_factory=dict)
    generator: str = "shapes_layout"
    generator_settings: dict[str, Any] = field(default_factory=dict)
    num_tests: int = 5  # k; ViUniT's tables use 5
    sampler: str = "coverage"
    embedding: str = "hashing"
    embedding_dim: int = 256
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    cache_dir: str | None = None  # None: a private temporary directory for this reward's life
    seed: int = 0  # of the sampler and the image generator

    def __post_init__(self) -> None:
        if self.num_tests < 1:
            raise ValueError(f"unit_tests: num_tests must be >= 1, got {self.num_tests}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"unit_tests: unknown sampler {self.sampler!r}; valid: {SAMPLERS}")
        if self.embedding not in EMBEDDINGS:
            raise ValueError(f"unit_tests: unknown embedding {self.embedding!r}; valid: {EMBEDDINGS}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TestOutcome:
    caption: str
    expected: str
    status: str  # the execution status on the test image; "no_image" when none could be drawn
    answer: str | None
    score: float | None
    image: str | None = None  # the test image's file (in the test cache), for the run viewer

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ProgramReport:
    """One program's unit-test verdict: the reward and what each test saw (for logs and for
    ViUniT's re-prompting, which shows the failed tests to the model)."""

    query: str
    value: float | None  # None: no test could be run (no tests written, no image, infra errors)
    outcomes: tuple[TestOutcome, ...]

    def to_json(self) -> dict[str, Any]:
        return {"query": self.query, "value": self.value, "outcomes": [o.to_json() for o in self.outcomes]}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> ProgramReport:
        return cls(row["query"], row["value"], tuple(TestOutcome(**o) for o in row["outcomes"]))


class UnitTestReward:
    """Callable as a reward function `(examples, results, programs) -> list[float | None]`;
    `evaluate(queries, programs)` gives the full reports."""

    def __init__(
        self,
        config: UnitTestRewardConfig,
        runner: Any,
        writer: TestWriter | None = None,
        generator: ImageGenerator | None = None,
        embed: Embedder | None = None,
    ):
        self.config = config
        self.runner = runner
        self.writer = writer or build_writer(config.writer, **config.writer_settings)
        self.generator = generator or build_generator(config.generator, **config.generator_settings)
        self.embed = embed or hashing_embedder(config.embedding_dim)
        self.cache = UnitTestCache(config.cache_dir)
        self.counts: Counter = Counter()  # programs, executions, programs_without_tests
        self.seconds: Counter = Counter()  # tests, images, execution

    @property
    def stats(self) -> dict[str, Any]:
        return {**self.cache.stats.to_json(), **self.counts, "seconds": dict(self.seconds)}

    def _sample(self, candidates: list[UnitTest]) -> list[UnitTest]:
        k, seed = self.config.num_tests, self.config.seed
        if self.config.sampler == "random":
            return random_tests(candidates, k, seed)
        sampler = self.config.sampler
        return sample_tests(
            candidates, k, self.embed, use_answers=sampler != "input", seed=seed, balance=sampler == "balanced"
        )

    def tests(self, queries: Sequence[str], programs: Sequence[str] | None = None) -> list[list[UnitTest]]:
        """The k sampled tests per query (per program too, when the writer reads programs)."""
        start = time.perf_counter()
        candidates = self.cache.tests_for(self.writer, queries, programs)
        self.seconds["tests"] += time.perf_counter() - start
        return [self._sample(c) for c in candidates]

    def prepare(self, queries: Sequence[str], progress: bool = True) -> dict[str, Any]:
        """Write and draw every query's tests into the cache ahead of training, so that training
        never loads the test writer or the image generator (both load on their first cache miss).
        A writer that reads programs cannot write ahead: its tests depend on what is sampled."""
        if getattr(self.writer, "sees_program", False):
            raise ValueError("unit_tests: this writer reads the program, so its tests cannot be written ahead")
        tests = self.tests(list(dict.fromkeys(queries)))
        captions = [t.caption for ts in tests for t in ts]
        images = self.cache.images_for(self.generator, captions, self.config.seed, progress=progress)
        drawn = sum(path is not None for path in images.values())
        return {"queries": len(tests), "tests": len(captions), "images": drawn, **self.cache.stats.to_json()}

    def missing(self, queries: Sequence[str]) -> int:
        """Tests or images of these queries that would still have to be written or drawn (0: training
        never loads the writer or the generator). A writer that reads programs always has some."""
        if getattr(self.writer, "sees_program", False):
            return len(queries)
        absent = 0
        for query in dict.fromkeys(queries):
            candidates = self.cache.cached_tests(self.writer, query)
            if candidates is None:
                absent += 1
                continue
            absent += sum(
                not self.cache.has_image(self.generator, t.caption, self.config.seed) for t in self._sample(candidates)
            )
        return absent

    def evaluate(self, queries: Sequence[str], programs: Sequence[str], progress: bool = False) -> list[ProgramReport]:
        if len(queries) != len(programs):
            raise ValueError(f"got {len(queries)} queries for {len(programs)} programs")
        tests = self.tests(queries, programs)
        start = time.perf_counter()
        images = self.cache.images_for(
            self.generator, [t.caption for ts in tests for t in ts], self.config.seed, progress=progress
        )
        self.seconds["images"] += time.perf_counter() - start
        # One batch of unique (program, test image) pairs for the whole call.
        pairs: dict[tuple[str, Path], tuple[Example, str]] = {}
        for query, program, ts in zip(queries, programs, tests):
            for t in ts:
                path = images[t.caption]
                if path is not None and (program_key(program), path) not in pairs:
                    example = Example(
                        id=f"unit_test/{path.stem}",
                        dataset="unit_tests",
                        task="vqa",
                        query=query,
                        image=str(path),
                        answers=(t.answer,),
                    )
                    pairs[(program_key(program), path)] = (example, program)
        start = time.perf_counter()
        ran = self.runner.run(list(pairs.values()), progress=progress) if pairs else []
        self.seconds["execution"] += time.perf_counter() - start
        results: dict[tuple[str, Path], ExecutionResult] = dict(zip(pairs, ran))
        self.counts["programs"] += len(programs)
        self.counts["executions"] += len(pairs)
        return [self._report(q, p, ts, images, results) for q, p, ts in zip(queries, programs, tests)]

    def _report(self, query, program, tests, images, results) -> ProgramReport:
        outcomes, run, expected = [], [], []
        for t in tests:
            path = images[t.caption]
            # Cut like a trace: the outcomes ride in every rollout row of a label-free run.
            caption, expected_answer = t.caption[:MAX_TRACE], t.answer[:MAX_TRACE]
            if path is None:
                outcomes.append(TestOutcome(caption, expected_answer, "no_image", None, None))
                continue
            result = results[(program_key(program), path)]
            run.append(result)
            expected.append(t.answer)
            answer = None if result.answer is None else str(result.answer)[:MAX_TRACE]
            score = unit_test_score(result, t.answer, self.config.scoring)
            outcomes.append(TestOutcome(caption, expected_answer, result.status, answer, score, str(path)))
        value = program_score(run, expected, self.config.scoring) if run else None
        if value is None:
            self.counts["programs_without_tests"] += 1
        return ProgramReport(query, value, tuple(outcomes))

    def __call__(
        self, examples: Sequence[Example], results: Sequence[ExecutionResult], programs: Sequence[str]
    ) -> list[float | None]:
        return self.detailed(examples, results, programs)[0]

    def detailed(
        self, examples: Sequence[Example], results: Sequence[ExecutionResult], programs: Sequence[str]
    ) -> tuple[list[float | None], list[list[dict[str, Any]]]]:
        """The values and, per program, its tests' outcomes (`TestOutcome.to_json()` rows): what the
        run viewer shows of the label-free reward (`vprl.rewards.protocol.DetailedRewardFn`)."""
        # The real example's execution result is not needed: the tests are the evidence.
        reports = self.evaluate([e.query for e in examples], programs)
        return [r.value for r in reports], [[o.to_json() for o in r.outcomes] for r in reports]


def unit_tests_reward(
    writer: str = "shapes_rules",
    writer_settings: dict[str, Any] | None = None,
    generator: str = "shapes_layout",
    generator_settings: dict[str, Any] | None = None,
    num_tests: int = 5,
    sampler: str = "coverage",
    embedding: str = "hashing",
    embedding_dim: int = 256,
    aggregate: str = "mean",
    mode: str = "pass_ratio",
    threshold: float = 0.5,
    compile_penalty: float = 0.0,
    runtime_penalty: float = 0.0,
    cache_dir: str | None = None,
    seed: int = 0,
    runner: Any = None,
    run_dir: str | None = None,
) -> UnitTestReward:
    """ViUniT's label-free reward: the program's score on generated visual unit tests.

    `runner` is the live executor (`vprl.executor.runner.SyncRunner`), handed over by the trainer as a
    resource, like `run_dir`, the run folder: without a `cache_dir` the tests and their images are
    cached in `<run_dir>/unit_test_cache`, so a restarted run does not write or draw them again.
    Everything else is a plain setting from the recipe."""
    if runner is None:
        raise ValueError(
            "reward 'unit_tests' runs programs on its test images and needs the live resource 'runner' "
            "(an vprl.executor.runner.SyncRunner): build it with resources={'runner': runner}"
        )
    config = UnitTestRewardConfig(
        writer=writer,
        writer_settings=dict(writer_settings or {}),
        generator=generator,
        generator_settings=dict(generator_settings or {}),
        num_tests=int(num_tests),
        sampler=sampler,
        embedding=embedding,
        embedding_dim=int(embedding_dim),
        scoring=ScoringConfig(aggregate, mode, float(threshold), float(compile_penalty), float(runtime_penalty)),
        cache_dir=cache_dir or (str(Path(run_dir) / "unit_test_cache") if run_dir else None),
        seed=int(seed),
    )
    return UnitTestReward(config, runner)
