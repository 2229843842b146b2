"""Combinations of recipe settings that a GPU run would crash on or silently get wrong, refused when
the recipe is checked: before any model loads, and whether or not vLLM is installed on this machine
(each rule reads the recipe, the launcher's environment or the server, never vLLM itself).

- A quantized base with trl's vLLM generation. trl 1.16 (`trl/generation/vllm_generation.py`)
  starts a colocated engine with `quantization="bitsandbytes"` when the policy has 4-bit layers,
  merges the adapter into the NF4 base and streams the packed weights, which vLLM's loader refuses
  by shape at the first weight sync (trl issue 4973); a server gets the same packed tensors. An
  8-bit base trl refuses itself, but only once the model has loaded. ReST's vLLM sampler is not
  concerned: it serves the adapter as a LoRA request on the unquantized base and merges nothing.
- LoRA with vLLM weight sync under FSDP or DeepSpeed ZeRO-3: trl gathers the shards around its
  merge and marks that path untested ("TODO: does this work with FSDP?"); the drift-free sync
  (`vprl/train/online/weight_sync.py`) leaves it to trl. Nothing of it is tested here.
- A vLLM server reporting raw log-probabilities. The importance-sampling correction takes the
  server's log-probabilities as the processed ones trl asks a colocated engine for; a server started
  without `--logprobs-mode processed_logprobs` (vLLM's default is raw) gives raw ones, which the
  top_p correction (`vprl/train/online/sampler_logprobs.py`) would then correct a second time.
  The server's own configuration says which: trl's `VLLMClient.get_server_info` reads it from
  `/server_info`, which every server trl can sync weights into exposes (VLLM_SERVER_DEV_MODE=1).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from vprl.train.recipe.parsing import ConfigError

PROCESSED = "processed_logprobs"
SERVER_TIMEOUT_S = 10.0


def check_gpu_combinations(cfg: Any, server_info: Any = None) -> None:
    """Refuse what a GPU run cannot do; `server_info(url) -> dict` reads a vLLM server's configuration
    (default: its `/server_info` endpoint)."""
    t = cfg.training
    if cfg.algorithm == "rest" or not getattr(t, "use_vllm", False):
        return
    refuse_quantized_base(cfg)
    refuse_sharded_sync(os.environ)
    if t.vllm_mode == "server" and t.vllm_importance_sampling_correction:
        check_server_logprobs(server_url(t), server_info or read_server_info)


def refuse_quantized_base(cfg: Any) -> None:
    bits = "load_in_4bit (QLoRA)" if cfg.policy.load_in_4bit else "load_in_8bit" if cfg.policy.load_in_8bit else None
    if bits is None:
        return
    raise ConfigError(
        f"{bits} with use_vllm: trl 1.16 streams the adapter merged into the packed quantized base to vLLM, "
        "whose loader refuses it at the first weight sync (trl issue 4973). Either keep the quantized base and "
        "generate with transformers (use_vllm: false), or generate with vLLM from a LoRA policy in bf16 "
        f"({bits.split()[0]}: false)"
    )


def sharding(env: Any) -> str | None:
    """The parameter sharding `accelerate launch` set up for this process, or None."""
    if env.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        return "FSDP"
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3":
        return "DeepSpeed ZeRO-3"
    return None


def refuse_sharded_sync(env: Any) -> None:
    shards = sharding(env)
    if shards is None:
        return
    raise ConfigError(
        f"use_vllm under {shards}: syncing a sharded LoRA policy into vLLM is untested (trl marks its gathered "
        "merge TODO, and vprl's drift-free sync does not cover it). Train with DDP or DeepSpeed ZeRO-2 "
        "(configs/accelerate/ddp.yaml, deepspeed_zero2.yaml) and vLLM, or keep the sharding and set use_vllm false"
    )


def server_url(t: Any) -> str:
    return (t.vllm_server_base_url or f"http://{t.vllm_server_host}:{t.vllm_server_port}").rstrip("/")


def read_server_info(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/server_info?config_format=json", timeout=SERVER_TIMEOUT_S) as response:
        return json.load(response)["vllm_config"]


def check_server_logprobs(url: str, server_info: Any) -> None:
    """Refuse a server whose log-probabilities are not the processed ones, or whose mode cannot be read:
    a wrong mode biases every importance weight without an error anywhere."""
    fix = (
        "start it with `trl vllm-serve` (which sets --logprobs-mode processed_logprobs and VLLM_SERVER_DEV_MODE=1), "
        "or set vllm_importance_sampling_correction false"
    )
    try:
        mode = (server_info(url).get("model_config") or {}).get("logprobs_mode")
    except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
        raise ConfigError(
            f"vllm_mode server: the vLLM server at {url} did not say which log-probabilities it returns ({exc}); "
            f"the correction needs {PROCESSED}. Start the server before the run (vprl's launchers wait for it) and "
            f"{fix}"
        ) from None
    if mode != PROCESSED:
        raise ConfigError(
            f"vllm_mode server: the vLLM server at {url} returns {mode or 'unknown'} log-probabilities, not "
            f"{PROCESSED}: vllm_importance_sampling_correction would correct its top_p twice. Restart it: {fix}"
        )
