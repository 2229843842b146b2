"""Combinations a GPU run would crash on or silently get wrong (#34 items 2 and 8), refused when the
recipe is checked. vLLM is not installed here: each refusal must come before "vLLM is not installed"."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from vprl.train.recipe.checks import check_algorithm
from vprl.train.recipe.gpu_combinations import check_gpu_combinations, read_server_info
from vprl.train.recipe.parsing import ConfigError
from vprl.train.recipe.rl_config import parse_rl_config

REPO = Path(__file__).resolve().parents[1]
GRPO = str(REPO / "configs/grpo_codellama_gqa_correctness.yaml")
REST = str(REPO / "configs/rest_codellama_gqa_correctness.yaml")


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch):
    for key in ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED_ZERO_STAGE"):
        monkeypatch.delenv(key, raising=False)


def _cfg(recipe: str, *extra: str):
    return parse_rl_config(["--config", recipe, "--output_dir", "unused", *extra])


def test_item2_qlora_with_vllm_is_refused_naming_both_alternatives():
    with pytest.raises(ConfigError, match=r"load_in_4bit \(QLoRA\) with use_vllm") as err:
        check_algorithm(_cfg(GRPO, "--load_in_4bit", "true"))
    message = str(err.value)
    assert "use_vllm: false" in message and "LoRA policy in bf16" in message and "load_in_4bit: false" in message
    with pytest.raises(ConfigError, match=r"load_in_8bit with use_vllm"):
        check_algorithm(_cfg(GRPO, "--load_in_8bit", "true", "--vllm_mode", "server"))


def test_item2_qlora_without_vllm_and_rest_sampling_with_vllm_pass():
    """transformers generation takes the 4-bit policy; ReST's vLLM serves the adapter as a LoRA
    request on the unquantized base, merging nothing (it fails only because vLLM is absent here)."""
    check_gpu_combinations(_cfg(GRPO, "--load_in_4bit", "true", "--use_vllm", "false"))
    check_gpu_combinations(_cfg(REST, "--load_in_4bit", "true"))
    with pytest.raises(ConfigError, match=r"vLLM is not installed"):
        check_algorithm(_cfg(REST, "--load_in_4bit", "true"))


@pytest.mark.parametrize(
    ("env", "named"),
    [({"ACCELERATE_USE_FSDP": "true"}, "FSDP"),
     ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}, "DeepSpeed ZeRO-3")],
)  # fmt: skip
def test_item8_sharded_lora_with_vllm_weight_sync_is_refused(monkeypatch, env, named):
    # Parsed first: with DeepSpeed named, transformers' arguments would want deepspeed installed.
    cfg, without = _cfg(GRPO), _cfg(GRPO, "--use_vllm", "false")
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # what `accelerate launch` sets for these configs
    with pytest.raises(
        ConfigError, match=rf"use_vllm under {named}: .*ZeRO-2.*or keep the sharding and set use_vllm false"
    ):
        check_algorithm(cfg)
    check_gpu_combinations(without)


def test_item8_zero2_with_vllm_passes(monkeypatch):
    cfg = _cfg(GRPO)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    check_gpu_combinations(cfg)


class _Server:
    """A stand-in for vLLM's `/server_info` (VLLM_SERVER_DEV_MODE=1), answering with `mode`."""

    def __init__(self, mode: str):
        body = json.dumps({"vllm_config": {"model_config": {"logprobs_mode": mode}}}).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                ok = self.path == "/server_info?config_format=json"
                self.send_response(200 if ok else 404)
                self.end_headers()
                self.wfile.write(body if ok else b"{}")

            def log_message(self, *args):
                return

        self.httpd = HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_item8_a_server_returning_raw_logprobs_is_refused(mode):
    server = _Server(mode)
    try:
        server_args = (
            "--vllm_mode",
            "server",
            "--vllm_server_host",
            "127.0.0.1",
            "--vllm_server_port",
            str(server.port),
        )
        cfg = _cfg(GRPO, *server_args, "--vllm_importance_sampling_correction", "true")
        assert read_server_info(f"http://127.0.0.1:{server.port}")["model_config"]["logprobs_mode"] == mode
        if mode == "processed_logprobs":
            check_gpu_combinations(cfg)
            return
        with pytest.raises(ConfigError, match=r"returns raw_logprobs log-probabilities.*correct its top_p twice"):
            check_algorithm(cfg)
        check_gpu_combinations(_cfg(GRPO, *server_args, "--vllm_importance_sampling_correction", "false"))
    finally:
        server.close()


def test_item8_a_server_that_does_not_say_its_mode_is_refused():
    with pytest.raises(ConfigError, match=r"did not say which log-probabilities it returns.*trl vllm-serve"):
        check_gpu_combinations(_cfg(GRPO, "--vllm_mode", "server", "--vllm_server_base_url", "http://127.0.0.1:9"))
