"""Gains with error bars (`vprl.train.evaluation.gains`): the two-level bootstrap's interval covers the
truth and excludes 0 for a real gain, includes 0 for none, and widens when seeds disagree."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vprl.data.records import Example
from vprl.data.shapes.tasks import load_shapes_task
from vprl.train.evaluation.gains import paired_gain, question_scores, share_of_gain


def _scores(p: float, n: int, rng: np.random.Generator) -> dict[str, float]:
    return {f"q{i}": float(rng.random() < p) for i in range(n)}


def _runs(p_before, p_after, seeds=3, n=200, seed=0):
    rng = np.random.default_rng(seed)
    before = [_scores(p_before, n, rng) for _ in range(seeds)]
    after = [_scores(p_after[s] if isinstance(p_after, list) else p_after, n, rng) for s in range(seeds)]
    return before, after


def test_a_real_gain_has_an_interval_above_zero_that_covers_it():
    gain = paired_gain(*_runs(0.4, 0.6), reps=1000)
    assert gain.low > 0 and gain.low < 0.2 < gain.high and gain.seeds == 3 and gain.questions == 200
    assert gain.text().startswith("+") and "[" in gain.text()


def test_no_gain_has_an_interval_around_zero():
    gain = paired_gain(*_runs(0.5, 0.5), reps=1000)
    assert gain.low < 0 < gain.high


def test_disagreeing_seeds_widen_the_interval():
    steady = paired_gain(*_runs(0.4, [0.6, 0.6, 0.6]), reps=1000)
    shaky = paired_gain(*_runs(0.4, [0.4, 0.6, 0.8]), reps=1000)
    assert shaky.std > steady.std and (shaky.high - shaky.low) > (steady.high - steady.low)


def test_share_of_gain_is_paired_and_checks_its_inputs():
    ref = _runs(0.4, 0.6, seed=1)
    half = (
        ref[0],
        [{k: (v if i % 2 else b[k]) for i, (k, v) in enumerate(a.items())} for a, b in zip(ref[1], ref[0])],
    )
    share = share_of_gain(ref, half, reps=500)
    assert 0.3 < share.mean < 0.7 and share.low < share.mean < share.high
    with pytest.raises(ValueError, match="same seeds and questions"):
        share_of_gain(ref, (ref[0][:2], ref[1][:2]))
    with pytest.raises(ValueError, match="same questions"):
        paired_gain([{"a": 1.0}], [{"b": 1.0}])


def test_question_scores_read_an_evaluations_predictions(tmp_path):
    examples = [Example(f"e{i}", "gqa", "vqa", "q", "i.png", answers=("red",)) for i in range(3)]
    rows = [
        {"policy": "after_rl", "mode": "single", "dataset": "d", "seed": 0, "example_id": "e0", "answer": "red",
         "status": "ok"},
        {"policy": "after_rl", "mode": "single", "dataset": "d", "seed": 0, "example_id": "e1", "answer": None,
         "status": "runtime_error", "fallback_answer": "red"},
        {"policy": "after_rl", "mode": "single", "dataset": "d", "seed": 0, "example_id": "e2", "answer": "blue",
         "status": "ok"},
        {"policy": "after_rl", "mode": "single", "dataset": "d", "seed": 1, "example_id": "e2", "answer": "red",
         "status": "ok"},
    ]  # fmt: skip
    path = tmp_path / "predictions.jsonl"
    path.write_text("".join(json.dumps({"program": "", "refused": False, "fallback_answer": None,
                                        "unit_test_score": None} | r) + "\n" for r in rows))  # fmt: skip
    assert question_scores(path, examples, "after_rl") == {"e0": 1.0, "e1": 0.0, "e2": 0.0}
    assert question_scores(path, examples, "after_rl", use_fallback=True)["e1"] == 1.0
    with pytest.raises(ValueError, match="no before_rl/single prediction for 3"):
        question_scores(path, examples, "before_rl")


def test_the_learning_bench_summarizes_runs(tmp_path):
    """bench/learning.py's summary over two seeds and both rewards, from evaluations of scripted
    policies (the after-RL policy makes fewer mistakes with the correctness reward than with the
    label-free one), so the signs and the share are known."""
    from evaluate_helpers import ScriptedPolicy, all_gold, build_world

    from vprl.train.evaluation.pipeline import EvalConfig, evaluate

    learning = _learning_bench()
    world = tmp_path / "world"
    build_world(world, val=16)
    gold = all_gold(world)
    trained = tmp_path / "trained.jsonl"  # a few training queries: most of val is unseen
    trained.write_text("".join(json.dumps(e.to_json()) + "\n" for e in load_shapes_task(world, "train")[:4]))
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "config.json").write_text("{}")
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": str(tmp_path / "policy")})
    )
    # The scripted policy never loads weights, but the evaluation refuses an adapter folder without them.
    (tmp_path / "adapter" / "adapter_model.safetensors").write_bytes(b"")
    runs = []
    for seed in (0, 1):
        for reward, share in (("correctness", 0.1), ("unit_tests", 0.35)):
            cfg = EvalConfig(
                model_name_or_path=str(tmp_path / "policy"), adapters=f"after_rl={tmp_path / 'adapter'}", base_label="before_rl",
                shapes_root=str(world), seen_from=str(trained), seen_split=["shapes:val"], prompt_layout="bare",
                datasets=["shapes:val", "shapes:heldout", "shapes:winoground"], fallback=True,
                out=str(tmp_path / f"eval_{seed}_{reward}"),
            )  # fmt: skip
            report = evaluate(
                cfg, make_generator=lambda p, s=share: ScriptedPolicy(gold, wrong_share=s if p.adapter else 0.6)
            )
            runs.append({
                "seed": seed, "reward": reward, "max_steps": 1, "predictions": str(report["paths"]["predictions"]),
                "timing": {"rl_s": 10.0 if reward == "correctness" else 12.0}, "seen_from": str(trained),
                "headline": learning._headlines(report["results"]), "exceptions": learning._exceptions(report["results"]),
            })  # fmt: skip
    summary = learning.summarize(runs, world)
    unseen = summary["gains"]["correctness"]["shapes:val-unseen"]
    assert unseen["mean"] > 0 and unseen["seeds"] == 2 and unseen["low"] <= unseen["mean"] <= unseen["high"]
    assert "shapes:winoground" in summary["gains"]["unit_tests+fallback"]
    assert 0 < summary["label_free_share"]["mean"] < 1 and summary["time_ratio"] == [1.2, 1.2]
    assert "label-free gain as a share" in learning.markdown(summary)


def test_the_learning_bench_times_steps_and_refuses_runs_of_an_older_recipe(tmp_path):
    """RL time comes from the per-step logs (a run resumed from a checkpoint is not timed from its
    wall clock), and a run trained with another version of its recipe is not mixed in: the bench
    stops before quickstart would resume it from its checkpoints."""
    learning = _learning_bench()
    run = tmp_path / "seed0" / "rl"
    run.mkdir(parents=True)
    rows = [{"step": 1, "step_time": 1.5}, {"step": 2, "step_time": 2.0}, {"train_runtime": 99.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert learning.step_seconds(str(run)) == 3.5
    record = {"seed": 0, "reward": "correctness", "max_steps": 5, "run_dir": str(run), "recipe": "an older recipe"}
    (tmp_path / "runs.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(SystemExit, match="older recipe"):
        learning.main(["--out", str(tmp_path), "--seeds", "0", "--rewards", "correctness", "--max_steps", "5"])


def test_the_learning_bench_reads_an_ablation_and_refuses_a_malformed_one():
    learning = _learning_bench()
    kl = learning.Variant.parse("kl=correctness:--beta 0.04")
    assert (kl.label, kl.rl_args) == ("correctness+kl", "--beta 0.04")
    assert learning.stamp("correctness", kl).endswith(" --beta 0.04")
    for bad in ("kl=correctness", "kl=nope:--beta 0.04", "k l=correctness:--beta 1", "=correctness:--beta 1"):
        with pytest.raises(ValueError, match="--variant"):
            learning.Variant.parse(bad)


def _learning_bench():
    """bench/learning.py as a module (registered first: its dataclasses look their module up)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("learning_bench", "bench/learning.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["learning_bench"] = module
    spec.loader.exec_module(module)
    return module
