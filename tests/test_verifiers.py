"""ExoViP verifier reward: opposites, claims, scoring through the tool host on the shapes world."""

from __future__ import annotations

import numpy as np
import pytest

from vprl.data.shapes import BuildConfig, build_dataset, load_gold_programs
from vprl.data.shapes.tasks import load_shapes_tasks, scene_graph_files
from vprl.executor.host import ToolHost
from vprl.executor.results import ExecutionResult
from vprl.executor.runner import RunnerConfig, SyncRunner
from vprl.executor.tools.stack import build_backend
from vprl.rewards.compose import RewardComposer, RewardConfig, RewardSpec
from vprl.rewards.correctness import yes_no
from vprl.rewards.registry import build_reward, reward_names
from vprl.rewards.verifiers.claims import build_claim
from vprl.rewards.verifiers.embedders import build_embedder
from vprl.rewards.verifiers.opposites import DEFAULT_GROUPS, OppositeConfig, OppositeSampler
from vprl.rewards.verifiers.reward import VerifierConfig, VerifierReward
from vprl.rewards.verifiers.scores import Check, ClaimScorer, contrasts, yes_minus_no
from vprl.rewards.verifiers.tools import ToolCaller


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes_verifier")
    build_dataset(BuildConfig(out=str(root), train=4, val=30, seed=5, winoground=2, sugarcrepe=2, refcoco=2))
    return root


def _oracle(world):
    return build_backend({"backend": "oracle", "scene_graphs": [str(p) for p in scene_graph_files(world)]})


def _wrong(answer: str, sampler: OppositeSampler) -> str | None:
    folded = yes_no(answer)
    if folded is not None:
        return "no" if folded == "yes" else "yes"
    return sampler.opposite(answer)


# -- opposites -------------------------------------------------------------------------------------
def test_opposites_are_sensible_and_pluggable():
    sampler = OppositeSampler()
    assert sampler.opposite("red") in DEFAULT_GROUPS["color"] and sampler.opposite("red") != "red"
    assert sampler.opposite("Yes") == "no" and sampler.opposite("no") == "yes"
    assert sampler.opposite("left") == "right" and sampler.opposite("top") == "bottom"
    assert sampler.opposite("above") == "below" and sampler.opposite("small") == "large"
    assert sampler.opposite("hexagon") in DEFAULT_GROUPS["shape"]
    # a word in no group is contrasted with the least similar word of the whole vocabulary (ExoViP)
    assert sampler.opposite("nightstand") in sampler.vocabulary
    # the embedder decides within a group: an embedder that puts "blue" far from "red" picks it
    colours = DEFAULT_GROUPS["color"]

    def embed(texts):
        return np.array([[1.0, 0.0] if t == "red" else [-1.0, 0.0] if t == "blue" else [0.6, 0.8] for t in texts])

    assert OppositeSampler(embedder=embed).opposite("red") == "blue"
    picks = {OppositeSampler(config=OppositeConfig("random_below", seed=s)).opposite("red") for s in range(12)}
    assert picks <= set(colours) - {"red"} and len(picks) > 1  # random among the dissimilar ones, per seed
    again = OppositeSampler(config=OppositeConfig("random_below", seed=3))
    assert again.opposite("red") == OppositeSampler(config=OppositeConfig("random_below", seed=3)).opposite("red")
    with pytest.raises(ValueError, match="strategy"):
        OppositeConfig("closest")


def test_embedders_hashing_and_a_tiny_clip(tmp_path):
    import tiny_models as tiny

    vecs = build_embedder("hashing")(["a red square", "a red square", "blue"])
    assert np.allclose(vecs[0], vecs[1]) and np.isclose(np.linalg.norm(vecs[2]), 1.0)
    clip = build_embedder("clip:" + tiny.build("clip", tmp_path))
    out = clip(["red", "blue", "red"])
    assert out.shape[0] == 3 and np.allclose(np.linalg.norm(out, axis=1), 1.0) and np.allclose(out[0], out[2])
    assert OppositeSampler(embedder=clip).opposite("green") in DEFAULT_GROUPS["color"]
    with pytest.raises(ValueError, match="embedder"):
        build_embedder("word2vec")


# -- claims ----------------------------------------------------------------------------------------
def test_claims_from_questions_and_answers():
    known = frozenset(OppositeSampler().vocabulary)
    c = build_claim("What color is the triangle to the left of the magenta star?", "Orange", known)
    assert c.phrase == "the orange triangle to the left of the magenta star"
    assert c.questions == ("is the triangle to the left of the magenta star orange?",) and c.slots == ("orange",)
    # swapping the answer leaves the question's own words alone, even when they are the same word
    odd = build_claim("What color is the hexagon?", "hexagon", known)
    assert odd.swap("hexagon", "circle").phrase == "the circle hexagon"
    shape = build_claim("What shape is the small blue object?", "star", known)
    assert shape.phrase == "the small blue star" and shape.questions == ("is the small blue object a star?",)
    no = build_claim("Is there a red circle?", "no", known)
    assert no.polarity == -1 and no.yes_no and no.slots == ("red", "circle")
    both = build_claim("Is there both a red circle and a blue star?", "yes", known)
    assert both.questions == ("is there a red circle?", "is there a blue star?") and not both.any_of
    choose = build_claim("Is the large star yellow or orange?", "orange", known)
    assert choose.alternatives == ("yellow", "orange") and choose.phrase == "the large orange star"
    itm = build_claim('Verify image matches text="a red star above a blue square"', "yes", known)
    assert itm.phrase == "a red star above a blue square" and "above" in itm.slots


# -- the VQA verifier: P(yes) - P(no) from the tool's scores over ["yes", "no"] --------------------------
class _ScoredVqa:
    """Answers `vqa(question, choices)` with a fixed P(yes) per question and records the calls."""

    def __init__(self, p_yes):
        self.p_yes, self.calls = p_yes, []

    def call(self, calls):
        self.calls.extend(calls)
        return [
            {
                "answer": "?",
                "scores": {"yes": self.p_yes[c.args["question"]], "no": 1 - self.p_yes[c.args["question"]]},
            }
            for c in calls
        ]


def test_vqa_verifier_uses_yes_no_probabilities_contrasted_with_the_opposite():
    opposites = OppositeSampler()
    claim = build_claim("What color is the circle?", "red", frozenset(opposites.vocabulary))
    (contrast,) = contrasts(claim, opposites)
    (question,), (other,) = claim.questions, contrast.questions
    caller = _ScoredVqa({question: 0.8, other: 0.3})
    scorer = ClaimScorer(caller, opposites, build_embedder("hashing"), verifiers=("vqa",))
    (score,) = scorer.score([Check("img", None, claim)])
    assert {c.tool for c in caller.calls} == {"vqa"} and all(c.args["choices"] == ["yes", "no"] for c in caller.calls)
    # V(claim) = 0.8 - 0.2, V(opposite) = 0.3 - 0.7: (0.6 - (-0.4)) / 2
    assert score.scores["vqa"] == pytest.approx(0.5)
    # a model biased towards "yes" on both gains nothing from the bias
    (biased,) = ClaimScorer(
        _ScoredVqa({question: 0.9, other: 0.9}), opposites, build_embedder("hashing"), verifiers=("vqa",)
    ).score([Check("img", None, claim)])
    assert biased.scores["vqa"] == pytest.approx(0.0)
    assert yes_minus_no({"answer": "no", "scores": {"yes": 0.25, "no": 0.75}}) == pytest.approx(-0.5)
    assert yes_minus_no("Yes.") == 1.0 and yes_minus_no("maybe") == 0.0  # a bare string: one-hot
    assert yes_minus_no({"answer": "no"}) is None and yes_minus_no({"scores": {"yes": float("nan")}}) is None


# -- the reward on the shapes world ------------------------------------------------------------------
@pytest.mark.parametrize("backend_name", ["oracle", "shapes"])
def test_right_answers_score_above_wrong_ones(world, backend_name):
    tasks = load_shapes_tasks(world, ["val", "heldout"])
    examples = [e for e in tasks["val"] + tasks["heldout"] if e.answers]
    backend = _oracle(world) if backend_name == "oracle" else build_backend({"backend": "shapes"})
    host = ToolHost(backend)
    reward = build_reward("verifier", {"tool_host": host})
    try:
        wrong = [_wrong(e.answers[0], reward.opposites) for e in examples]
        keep = [i for i, w in enumerate(wrong) if w is not None]
        exs = [examples[i] for i in keep] * 2
        answers = [examples[i].answers[0] for i in keep] + [wrong[i] for i in keep]
        results = [ExecutionResult(e.id, "k", "ok", answer=a) for e, a in zip(exs, answers)]
        values = reward(exs, results, ["p"] * len(exs))
    finally:
        reward.caller.close()
        host.close()
    n = len(keep)
    right = np.array([0.0 if v is None else v for v in values[:n]])
    bad = np.array([0.0 if v is None else v for v in values[n:]])
    assert n >= 40 and sum(v is not None for v in values) > 0.8 * len(values)
    assert right.mean() > bad.mean() + 0.1
    assert np.mean(right > bad) + 0.5 * np.mean(right == bad) > 0.55  # pairwise AUC (bench: ~0.6)


def test_verifier_calls_go_through_the_host_cache_and_infra_failures_are_masked(world):
    examples = load_shapes_tasks(world, ["val"])["val"][:12]
    results = [ExecutionResult(e.id, "k", "ok", answer=e.answers[0]) for e in examples]
    host = ToolHost(_oracle(world))
    reward = VerifierReward(ToolCaller(host))
    try:
        first = reward(examples, results, ["p"] * len(examples))
        before = host.metrics()
        second = reward(examples, results, ["p"] * len(examples))
        after = host.metrics()
    finally:
        reward.caller.close()
        host.close()
    assert first == second and any(v is not None for v in first)
    assert after["backend_calls"] == before["backend_calls"] and after["cache_hits"] > before["cache_hits"]
    # a backend that cannot answer (no scene graph for these images) is our failure: masked, not scored
    blind = ToolHost(build_backend({"backend": "oracle"}, scenes={}))
    masked = VerifierReward(ToolCaller(blind))
    try:
        assert masked(examples, results, ["p"] * len(examples)) == [None] * len(examples)
        assert masked.counts["masked"] == len(examples)
    finally:
        masked.caller.close()
        blind.close()


def test_registry_composer_and_trace_verification(world):
    assert "verifier" in reward_names()
    with pytest.raises(ValueError, match="runner"):
        build_reward("verifier")
    with pytest.raises(ValueError, match="unknown setting"):
        build_reward("verifier", {"tool_host": object()}, verifers=["itm"])
    with pytest.raises(ValueError, match="subset"):
        VerifierConfig(verifiers=("itm", "clip"))
    examples = load_shapes_tasks(world, ["val"])["val"][:10]
    gold = load_gold_programs(world)["vqa"]
    programs = [gold[e.query] for e in examples]
    broken = "def execute_command(image):\n    return 1/0\n"
    config = RewardConfig(
        rewards=(
            RewardSpec("correctness"),
            RewardSpec("verifier", 0.5, {"verifiers": ["itm", "vqa"], "intermediate_weight": 0.5}),
        )
    )
    with SyncRunner(ToolHost(_oracle(world)), RunnerConfig(slots=2)) as runner:
        composer = RewardComposer(config, {"runner": runner})
        results = runner.run(list(zip(examples + examples[:1], programs + [broken])))
        batch = composer(examples + examples[:1], results, programs + [broken])
        fn = composer.functions[1][1]
        traced = [c for r in results[:-1] for c in fn.trace_checks(r.tool_calls, fn.caller.image(examples[0]).ref)]
    assert set(batch.components) == {"correctness", "verifier"}
    assert batch.components["verifier"][-1] is None and batch.totals[-1] < 0  # failures get the penalty
    values = [v for v in batch.components["verifier"][:-1] if v is not None]
    assert len(values) >= 8 and np.mean(values) > 0
    assert traced and {c.claim.polarity for c in traced} <= {1, -1}
