"""The inference and serving paths of the real-engine driver (`vllm_cpu_driver.py`): the evaluation's
engines, the unit-test writer's vLLM backend and `trl vllm-serve`, each measured the way the driver's
training paths are; the driver runs them and `tests/test_vllm_cpu_engine.py` judges the record."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vllm_cpu_probes import max_difference, model_logprobs, processes_left, wait_until_healthy

ENGINE_KWARGS = {"dtype": "float32", "enforce_eager": True, "max_model_len": 1024}


def evaluation_path(entry: dict, root: Path, world: Path, policy: Path, adapter: str) -> None:
    """An evaluation of two policies (the base, then an adapter) sampling with vLLM: each policy's
    engine is shut down before the next starts, and none outlives the evaluation."""
    import gc
    import weakref

    import psutil

    import vprl.train.evaluation.session as session
    from vprl.train.evaluation.config import EvalConfig
    from vprl.train.evaluation.pipeline import evaluate

    engines: list = []
    built = session.policy_generator

    def recorded(cfg, policy_spec):
        generator = built(cfg, policy_spec)
        generator.generate(["# warm\ndef execute_command(image):"], _greedy(4))  # starts the engine
        engines.append(weakref.ref(generator.engine))
        entry.setdefault("engines_alive_at_start", []).append(sum(r() is not None for r in engines))
        return generator

    session.policy_generator = recorded
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    cfg = EvalConfig(
        model_name_or_path=str(policy),
        shapes_root=str(world),
        prompt_layout="bare",
        limit=2,
        max_completion_length=24,
        datasets="shapes:val",
        modes="single",
        generator="vllm",
        vllm_kwargs=json.dumps(ENGINE_KWARGS),
        adapters=f"rl={adapter}",
        out=str(root / "evaluation"),
    )
    try:
        report = evaluate(cfg)
    finally:
        session.policy_generator = built
    gc.collect()
    entry["policies"] = sorted(report["results"])
    entry["engines"] = len(engines)
    entry["engines_alive_after"] = sum(r() is not None for r in engines)
    entry["new_processes_left"] = processes_left(children)


def _greedy(tokens: int):
    from vprl.train.sampling.generator import policy_sampling

    return policy_sampling(temperature=0.0, max_new_tokens=tokens, stop=())


def unit_test_writer_path(entry: dict, world: Path, policy: Path) -> None:
    """The unit-test writer's vLLM backend against its transformers backend, greedy, on the same
    prompts: the same text (both float32)."""
    from vprl.rewards.unit_tests.llm_backends import BackendSettings, build_text_backend

    prompts = probe_prompts(world)
    replies = {}
    for backend in ("vllm", "transformers"):
        settings = BackendSettings(model=str(policy), backend=backend, dtype="float32", chat_template=False)
        replies[backend] = build_text_backend(settings).generate(prompts, _greedy(24))
    entry["replies"] = replies


def probe_prompts(world: Path) -> list[str]:
    from vprl.data.shapes import load_gold_programs
    from vprl.train.prompts import PromptConfig, PromptTemplate

    template = PromptTemplate.from_config(PromptConfig(layout="bare"))
    return [template.build(q) for q in list(load_gold_programs(world)["vqa"])[:3]]


def server_path(entry: dict, out: Path, policy: Path, ids: list[int]) -> None:
    """`trl vllm-serve` on loopback and trl's client, as a server-mode run generates (its weight sync
    needs NCCL, so no training step): the served log-probabilities against the model's."""
    import socket
    import subprocess

    from transformers import AutoModelForCausalLM
    from trl.generation.vllm_client import VLLMClient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [str(Path(sys.executable).parent / "trl"), "vllm-serve", "--model", str(policy), "--host", "127.0.0.1"]
    command += ["--port", str(port), "--enforce_eager", "--dtype", "float32", "--max_model_len", "1024"]
    with open(out / "server.log", "w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_until_healthy(server, f"http://127.0.0.1:{port}/health/", out / "server.log")
            client = VLLMClient(base_url=f"http://127.0.0.1:{port}", connection_timeout=10)
            out = client.generate([ids[:30], ids[:40]], n=2, temperature=1.0, max_tokens=16, logprobs=0)
            model = AutoModelForCausalLM.from_pretrained(str(policy), dtype="float32")
            differences = []
            prompts = [ids[:30]] * 2 + [ids[:40]] * 2
            for prompt, completion, logprobs in zip(prompts, out["completion_ids"], out["logprobs"], strict=True):
                expected = model_logprobs(model, prompt + list(completion))[len(prompt) - 1 :]
                differences.append(max_difference([lp[0] for lp in logprobs], expected))
            entry["completions"] = [len(c) for c in out["completion_ids"]]
            entry["logp_difference"] = max(differences)
            # The recipe check of a server-mode run reads which log-probabilities the server returns.
            from vprl.train.recipe.gpu_combinations import check_server_logprobs, read_server_info

            url = f"http://127.0.0.1:{port}"
            entry["logprobs_mode"] = (read_server_info(url).get("model_config") or {}).get("logprobs_mode")
            check_server_logprobs(url, read_server_info)  # raises ConfigError where it would refuse the run
            entry["recipe_check_accepts"] = True
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    entry["server_exit"] = server.returncode
