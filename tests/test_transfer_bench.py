"""`bench/transfer.py` end to end at a tiny size: two seeds, two arms (the mixture, label-free
adaptation; the plain arm A is the quickstart's kind of run, trained in other tests), two RL steps each, one evaluation per seed, two jobs at once; the table, the heat map
and the figures, whose before-RL cells must equal the evaluation's own headlines. A second call
trains nothing."""

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BOOTSTRAP = (
    "--tasks vqa itm grounding --world_winoground 2 --world_sugarcrepe 1 --world_refcoco 6 "
    "--world_train 40 --world_val 10 --copies 1 --max_steps 20 --batch_size 16 --vocab_size 400 --hidden_size 32 "
    "--num_layers 1 --num_heads 2 --intermediate_size 64 --context 256 --eval_val 0 --eval_heldout 0 --threads 1"
)
# The tiny matrix takes about 3 minutes on 2 cores (its fixture: 2 seeds x 2 arms, 2 jobs).
RL = (
    "--per_device_train_batch_size 8 --num_generations 4 --max_completion_length 32 --save_steps 2 "
    "--report_to none --lora_r 4 --lora_alpha 8"
)


def _bench():
    spec = importlib.util.spec_from_file_location("transfer_bench", REPO / "bench/transfer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("transfer")
    ut = json.dumps([{"name": "unit_tests", "settings": {"num_tests": 2, "cache_dir": str(out / "ut")}}])
    argv = [
        "--seeds", "0,1", "--max_steps", "2", "--out", str(out), "--arms", "mixture,adapt_itm",
        "--bootstrap", BOOTSTRAP, "--rl_args", RL, "--arm_args", f"adapt_itm=--rewards '{ut}'",
        "--eval_world", json.dumps({"val": 12, "winoground": 2, "sugarcrepe": 1, "refcoco": 4}),
        "--eval_args", "--max_completion_length 32", "--jobs", "2",
    ]  # fmt: skip
    return out, argv, _bench().main(argv)


def test_the_matrix_has_a_cell_per_arm_and_task(measured):
    out, _, summary = measured
    assert summary["seeds"] == [0, 1] and summary["arms"] == ["mixture", "adapt_itm"]
    assert {"shapes:winoground", "shapes:sugarcrepe", "shapes:refcoco"} <= set(summary["datasets"])
    assert any(n.startswith("shapes:val-") for n in summary["datasets"])
    for arm in summary["arms"]:
        for name in summary["datasets"]:
            gain = summary["gains"][arm][name]
            assert gain["seeds"] == 2 and gain["low"] <= gain["mean"] <= gain["high"]
            assert gain["mean"] == pytest.approx(
                summary["accuracy"][arm][name] - summary["accuracy"]["before_rl"][name]
            )
    table = (out / "transfer.md").read_text()
    assert all(f"| {arm} |" in table for arm in summary["arms"]) and "Winoground group" in table
    assert (out / "transfer.png").stat().st_size > 10_000
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    jobs = {f"seed{s}_{stage}" for s in (0, 1) for stage in ("policy", "eval")}
    jobs |= {f"seed{s}_train_{arm}" for s in (0, 1) for arm in summary["arms"]}
    assert {log.stem for log in (out / "logs").iterdir()} == jobs
    assert sorted((r["seed"], r["arm"]) for r in runs) == sorted((s, a) for s in (0, 1) for a in summary["arms"])
    manifest = json.loads((out / "seed0" / "adapt_itm" / "manifest.json").read_text())
    assert manifest["dataset"]["labels"] is False and manifest["rewards"]["rewards"][0]["name"] == "unit_tests"


def test_before_rl_cells_are_the_evaluations_headlines(measured):
    from vprl.train.evaluation.metrics import DatasetMetrics, headline_value

    out, _, summary = measured
    for seed in (0, 1):
        report = json.loads((out / f"seed{seed}" / "eval" / "evaluation.json").read_text())
        assert set(report["results"]) == {"before_rl", *summary["arms"]}
    mean = {}
    for name in summary["datasets"]:
        values = []
        for seed in (0, 1):
            report = json.loads((out / f"seed{seed}" / "eval" / "evaluation.json").read_text())
            cell = report["results"]["before_rl"]["single"][name]
            values.append(headline_value(DatasetMetrics.from_json(cell[min(cell)])))
        mean[name] = sum(values) / 2
    assert summary["accuracy"]["before_rl"] == pytest.approx(mean)


def test_a_second_call_trains_nothing(measured):
    out, argv, summary = measured
    lines = (out / "runs.jsonl").read_text()
    evaluations = (out / "evaluations.jsonl").read_text()
    logs = {log.name: log.stat().st_mtime_ns for log in (out / "logs").iterdir()}
    again = _bench().main(argv)
    assert (out / "runs.jsonl").read_text() == lines and (out / "evaluations.jsonl").read_text() == evaluations
    assert {log.name: log.stat().st_mtime_ns for log in (out / "logs").iterdir()} == logs  # no job started
    assert again["gains"] == summary["gains"]


def test_a_failed_job_names_its_log_and_records_nothing(measured):
    out, argv, _ = measured
    runs = (out / "runs.jsonl").read_text()
    # parses (a typo would be refused before any job starts), but the run refuses the folder
    bad = [*argv, "--seeds", "0", "--arms", "vqa_itm", "--arm_args", "vqa_itm=--dataset_root /no/such/world"]
    with pytest.raises(SystemExit, match=r"seed0_train_vqa_itm failed; the end of .*seed0_train_vqa_itm\.log") as e:
        _bench().main(bad)
    assert "/no/such/world" in str(e.value) and (out / "runs.jsonl").read_text() == runs


def test_the_matrix_policy_writes_weak_caption_and_grounding_programs(measured):
    out, _, _ = measured
    summary = json.loads((out / "policy_seed0" / "bootstrap.json").read_text())
    assert summary["config"]["tasks"] == ["vqa", "itm", "grounding"]
    others = {f: v for f, v in summary["mixture"].items() if f.startswith(("itm:", "grounding:"))}
    assert {f.split(":")[0] for f in others} == {"itm", "grounding"}
    assert all(v["weak"] and v["p_gold"] == 0.3 and v["dominant"] for v in others.values())
    assert any(not v["weak"] for f, v in summary["mixture"].items() if ":" not in f)  # VQA: strong and weak


def test_the_quickstarts_policy_keeps_its_cache_key():
    """The new bootstrap keys at their defaults stay out of the key: the quickstart's policy is the
    one from before `--tasks` existed. The sandbox a policy is evaluated in is not in the key either."""
    from vprl.train.bootstrap.fit import BootstrapConfig

    assert BootstrapConfig(executor_sandbox="full").key() == BootstrapConfig(executor_sandbox="restricted").key()
    assert BootstrapConfig().key() == "0a305eed0f9da8d5" and BootstrapConfig(seed=1).key() == "64e8dc71209c22c2"
    assert BootstrapConfig(tasks=["vqa", "itm"]).key() != BootstrapConfig().key()
