"""The policy: a causal code LM with a LoRA adapter (peft), optionally on a 4-bit base (QLoRA).

Defaults are the ViUniT recipe's (r 16, alpha 32, dropout 0.05 on q/k/v/o). A run either starts a
fresh adapter (`peft_config` goes to the trainer, which wraps the model) or continues an existing
one (`adapter_path`, e.g. a bootstrapped policy), loaded trainable.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vprl.train.recipe.parsing import ConfigError
from vprl.train.recipe.rl_config import PolicyArgs

DTYPES = ("auto", "float32", "bfloat16", "float16")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


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
    check_policy_options(args)


def check_policy_options(args: PolicyArgs) -> None:
    """The loading options alone (dtype, framing, LoRA, quantization), for any command that loads it."""
    if args.torch_dtype not in DTYPES:
        raise ConfigError(f"torch_dtype: {args.torch_dtype!r} is not one of {DTYPES}")
    if args.framing not in ("auto", "plain", "chat"):
        raise ConfigError(f"framing: {args.framing!r} is not one of auto, plain, chat")
    if args.lora_r < 1 or args.lora_alpha <= 0 or not 0 <= args.lora_dropout < 1:
        raise ConfigError(f"LoRA: need lora_r >= 1, lora_alpha > 0, 0 <= lora_dropout < 1; got {args}")
    if args.load_in_4bit and args.load_in_8bit:
        raise ConfigError("load_in_4bit, load_in_8bit: choose one")
    if args.load_in_4bit or args.load_in_8bit:
        import importlib.util

        key = "load_in_4bit" if args.load_in_4bit else "load_in_8bit"
        if importlib.util.find_spec("bitsandbytes") is None:
            raise ConfigError(f"{key}: bitsandbytes is not installed (pip install 'vprl[quantization]')")


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


def placement(args: PolicyArgs, device: Any = None, for_training: bool = True) -> dict[str, Any]:
    """`from_pretrained` keywords that place the policy: the recipe's dtype ("auto": bf16 where the
    GPU has it, fp16 on an older GPU, fp32 on a CPU, where half precision is slow and poorly
    supported), 4- or 8-bit through bitsandbytes when asked. A quantized model cannot be moved after
    loading, and a model loaded for sampling is not moved by a trainer: both are placed on `device`
    (default: this process's GPU, else the CPU) now; a model for training is left to the trainer."""
    import torch

    cuda = torch.cuda.is_available()
    if args.torch_dtype != "auto":
        dtype = getattr(torch, args.torch_dtype)
    elif cuda:
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    else:
        dtype = torch.float32
    kwargs: dict[str, Any] = {"dtype": dtype}
    if args.load_in_4bit or args.load_in_8bit:
        from transformers import BitsAndBytesConfig

        if args.load_in_4bit:
            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type=args.bnb_4bit_quant_type,
                bnb_4bit_compute_dtype=getattr(torch, args.bnb_4bit_compute_dtype),
                bnb_4bit_use_double_quant=args.bnb_4bit_use_double_quant,
            )
        else:
            kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
    if kwargs.get("quantization_config") is not None or not for_training:
        where = device if device is not None else (f"cuda:{torch.cuda.current_device()}" if cuda else "cpu")
        kwargs["device_map"] = {"": where}
    return kwargs


def load_model(args: PolicyArgs, device: Any = None) -> tuple[Any, Any]:
    """(model, peft_config) for training: the base model (quantized when asked) and the LoRA config to
    apply, or a trainable PeftModel and None when continuing `adapter_path`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, **placement(args, device))
    if args.adapter_path:
        from peft import PeftModel

        return PeftModel.from_pretrained(model, args.adapter_path, is_trainable=True), None
    return model, lora_config(args)


def load_for_sampling(args: PolicyArgs, adapter: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) to sample from, placed like training places the policy (`placement`), on
    this process's GPU when there is one. The adapter is merged into the base weights (the same
    function without LoRA's extra matmuls per layer), except on a quantized base, where merging would
    re-quantize the sum. The tokenizer is the adapter folder's when it has one (added tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, **placement(args, for_training=False))
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
        if not (args.load_in_4bit or args.load_in_8bit):
            model = model.merge_and_unload()
    model.eval()
    # A policy saved from training may carry use_cache=False (gradient checkpointing); decoding
    # without the KV cache is an order of magnitude slower, and nothing here trains.
    model.config.use_cache = True
    model.generation_config.use_cache = True
    has_tokenizer = adapter and any((Path(adapter) / f).is_file() for f in TOKENIZER_FILES)
    tokenizer = AutoTokenizer.from_pretrained(adapter if has_tokenizer else args.model_name_or_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def wrap_with_lora(model: Any, peft_config: Any) -> Any:
    """The peft-wrapped model (for loops that train it themselves, like ReST)."""
    if peft_config is None:
        return model
    from peft import get_peft_model

    return get_peft_model(model, peft_config)


def describe(args: PolicyArgs) -> dict[str, Any]:
    """The manifest's policy entry (vprl.train.export reads `base_model` and `quantization`)."""
    return {
        "base_model": args.model_name_or_path,
        "name": policy_name(args),
        "adapter_path": args.adapter_path,
        "framing": args.framing,
        "quantization": "4bit" if args.load_in_4bit else "8bit" if args.load_in_8bit else "none",
        "load_in_4bit": args.load_in_4bit,
        "lora": {
            "r": args.lora_r,
            "alpha": args.lora_alpha,
            "dropout": args.lora_dropout,
            "target_modules": list(args.lora_target_modules),
        },
    }
