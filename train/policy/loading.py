"""The policy: a causal code LM with a LoRA adapter (peft), optionally on a 4-bit base (QLoRA).

Defaults are the ViUniT recipe's (r 16, alpha 32, dropout 0.05 on q/k/v/o). A run either starts a
fresh adapter (`peft_config` goes to the trainer, which wraps the model) or continues an existing
one (`adapter_path`, e.g. a bootstrapped policy), loaded trainable.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from train.recipe.parsing import ConfigError
from train.recipe.rl_config import PolicyArgs

DTYPES = ("auto", "float32", "bfloat16", "float16")


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def check_policy(args: PolicyArgs) -> None:
    """Config-time checks: the model exists (a local folder, or a hub id that is cached or may be
    downloaded), the adapter folder exists, the options are valid and bitsandbytes is importable."""
    path = args.model_name_or_path
    if not path:
        raise ConfigError("model_name_or_path: required (a model folder or a hub id)")
    if not Path(path).exists():
        if not _looks_like_hub_id(path):
            raise ConfigError(f"model_name_or_path: {path} does not exist")
        if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false"):
            from huggingface_hub import try_to_load_from_cache

            if not isinstance(try_to_load_from_cache(path, "config.json"), str):
                raise ConfigError(
                    f"model_name_or_path: {path} is not in the local hub cache and HF_HUB_OFFLINE is set"
                )
    elif not (Path(path) / "config.json").is_file():
        raise ConfigError(f"model_name_or_path: {path} has no config.json (not a model folder)")
    if args.adapter_path and not (Path(args.adapter_path) / "adapter_config.json").is_file():
        raise ConfigError(f"adapter_path: {args.adapter_path} has no adapter_config.json")
    if args.torch_dtype not in DTYPES:
        raise ConfigError(f"torch_dtype: {args.torch_dtype!r} is not one of {DTYPES}")
    if args.framing not in ("auto", "plain", "chat"):
        raise ConfigError(f"framing: {args.framing!r} is not one of auto, plain, chat")
    if args.lora_r < 1 or args.lora_alpha <= 0 or not 0 <= args.lora_dropout < 1:
        raise ConfigError(f"LoRA: need lora_r >= 1, lora_alpha > 0, 0 <= lora_dropout < 1; got {args}")
    if args.load_in_4bit:
        import importlib.util

        if importlib.util.find_spec("bitsandbytes") is None:
            raise ConfigError("load_in_4bit: bitsandbytes is not installed (pip install 'vprl[quantization]')")


def policy_name(args: PolicyArgs) -> str:
    return args.policy_name or Path(args.model_name_or_path.rstrip("/")).name


def load_tokenizer(args: PolicyArgs) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model_name_or_path)
    if tok.pad_token_id is None:
        # Padding is masked everywhere; EOS is the usual stand-in for code models without a pad token.
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def lora_config(args: PolicyArgs) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=list(args.lora_target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def load_model(args: PolicyArgs, device: Any = None) -> tuple[Any, Any]:
    """(model, peft_config): the base model (4-bit when asked) and the LoRA config to apply, or a
    trainable PeftModel and None when continuing `adapter_path`."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {}
    if args.torch_dtype != "auto":
        kwargs["dtype"] = getattr(torch, args.torch_dtype)
    elif not torch.cuda.is_available():
        kwargs["dtype"] = torch.float32  # half precision on a CPU is slow and poorly supported
    else:
        kwargs["dtype"] = "auto"
    if args.load_in_4bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=args.bnb_4bit_quant_type,
            bnb_4bit_compute_dtype=getattr(torch, args.bnb_4bit_compute_dtype),
            bnb_4bit_use_double_quant=args.bnb_4bit_use_double_quant,
        )
        # A quantized model cannot be moved after loading: place it on this process's device now.
        kwargs["device_map"] = {"": device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")}
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, **kwargs)
    if args.adapter_path:
        from peft import PeftModel

        return PeftModel.from_pretrained(model, args.adapter_path, is_trainable=True), None
    return model, lora_config(args)


def wrap_with_lora(model: Any, peft_config: Any) -> Any:
    """The peft-wrapped model (for loops that train it themselves, like ReST)."""
    if peft_config is None:
        return model
    from peft import get_peft_model

    return get_peft_model(model, peft_config)


def describe(args: PolicyArgs) -> dict[str, Any]:
    """The manifest's policy entry (train.export reads `base_model` and `quantization`)."""
    return {
        "base_model": args.model_name_or_path,
        "name": policy_name(args),
        "adapter_path": args.adapter_path,
        "framing": args.framing,
        "quantization": "4bit" if args.load_in_4bit else "none",
        "load_in_4bit": args.load_in_4bit,
        "lora": {
            "r": args.lora_r,
            "alpha": args.lora_alpha,
            "dropout": args.lora_dropout,
            "target_modules": list(args.lora_target_modules),
        },
    }
