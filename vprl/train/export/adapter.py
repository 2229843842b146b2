"""Export a run's LoRA adapter: a clean peft folder with a model card, optionally merged, optionally pushed.

`python -m vprl.train.export --run RUN --out OUT [--adapter iterations/iter-2/adapter] [--merge]
[--push_to_hub REPO_OR_PATH]` writes

    OUT/adapter_config.json, adapter_model.safetensors   the adapter (loads on the unquantized base)
    OUT/tokenizer files, README.md (model card), export.json (provenance)
    OUT/merged/                                           with --merge: base + adapter, safetensors

The adapter is re-written rather than copied: its config is checked for settings that tie it to a
quantized base (QA-LoRA, LoftQ), its tensors for quantization state, and `base_model_name_or_path`
is set to the run's base model. A QLoRA run (4-bit base during training) therefore exports an
adapter for the full-precision base; merging always loads that base unquantized, since merging
into 4-bit weights would re-quantize the sum.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from vprl.data.cli import CommandParser, fail
from vprl.train.export.model_card import render_model_card
from vprl.train.rollouts.log import RolloutLog
from vprl.train.runs.folder import (
    ADAPTER_CONFIG,
    ADAPTER_DIR,
    ADAPTER_WEIGHTS,
    MetricsLog,
    RunFolderError,
    read_config,
    read_manifest,
)

logger = logging.getLogger(__name__)

ADAPTER_WEIGHTS_BIN = "adapter_model.bin"
# Substrings of state-dict keys that only a bitsandbytes-quantized module writes.
QUANT_KEY_MARKERS = ("absmax", "quant_map", "quant_state", "nested_", ".SCB", "weight_format")
# Manifest keys that may name the base model (vprl/train/rl.py writes `base_model`; hand-made manifests
# may use the other spellings). `policy.name` is a display name, never a path.
BASE_MODEL_KEYS = ("base_model", "model_name_or_path", "model", "name_or_path", "path")


class ExportError(ValueError):
    pass


# --- reading the run folder ------------------------------------------------------------------


def policy_base_model(manifest: dict[str, Any], adapter_config: dict[str, Any]) -> str:
    policy = manifest.get("policy") or {}
    for key in BASE_MODEL_KEYS:
        if isinstance(policy.get(key), str) and policy[key]:
            return _located(policy[key])
    if adapter_config.get("base_model_name_or_path"):
        return _located(adapter_config["base_model_name_or_path"])
    raise ExportError("neither manifest.json's policy nor adapter_config.json names the base model; pass --base_model")


def read_evaluation(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "evaluation.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ExportError(
            f"--evaluation: {path} does not exist (vprl.train.evaluation writes evaluation.json)"
        ) from None
    except json.JSONDecodeError as exc:
        raise ExportError(f"--evaluation: {path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("matrix"), dict):
        raise ExportError(f"--evaluation: {path}: not an evaluation.json of vprl.train.evaluation (no matrix)")
    return data


def write_run_cards(run: str | Path, source: str | Path) -> None:
    """The project's model card in the run folder and its adapter folder, replacing the generic cards
    trl and peft write there when the adapter is saved."""
    run, source = Path(run), Path(source)
    manifest = read_manifest(run)
    adapter_config = json.loads((source / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    base = policy_base_model(manifest, adapter_config)
    weights = source / ADAPTER_WEIGHTS
    card = render_model_card(
        run=run,
        manifest=manifest,
        config=read_config(run),
        metrics=MetricsLog(run).read(),
        rollouts=RolloutLog.in_run(run).read(),
        adapter_config=adapter_config,
        export={
            "out": str(source),
            "adapter_source": str(source.relative_to(run)) if source.is_relative_to(run) else str(source),
            "base_model": base,
            "quantization": policy_quantization(manifest),
            "weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else None,
        },
    )
    card.save(str(source / "README.md"))
    card.save(str(run / "README.md"))


def _located(base: str) -> str:
    """A base model in a local folder as an absolute path: a relative one (`runs/tiny_policy`) only
    resolves from the folder the run was started in, so `AutoPeftModelForCausalLM.from_pretrained`
    on the export failed anywhere else. A Hub id stays as it is."""
    path = Path(base).expanduser()
    return str(path.resolve()) if not path.is_absolute() and path.is_dir() else base


def policy_quantization(manifest: dict[str, Any]) -> str:
    """ "4bit", "8bit" or "none", from `policy.quantization` (a string or a bitsandbytes-style dict)."""
    policy = manifest.get("policy") or {}
    quant = policy.get("quantization")
    if isinstance(quant, dict):
        quant = "4bit" if quant.get("load_in_4bit") else "8bit" if quant.get("load_in_8bit") else "none"
    if policy.get("load_in_4bit"):
        quant = "4bit"
    text = str(quant or "none").lower()
    return "4bit" if "4" in text or text in ("qlora", "nf4", "fp4") else "8bit" if "8" in text else "none"


def find_adapter(run: Path, adapter: str | None) -> Path:
    path = run / (adapter or ADAPTER_DIR)
    if (path / ADAPTER_CONFIG).is_file():
        return path
    found = sorted(str(p.parent.relative_to(run)) for p in run.glob("**/" + ADAPTER_CONFIG))
    hint = f"; adapters in this run: {', '.join(found)} (pass one with --adapter)" if found else ""
    raise ExportError(f"{path}: no {ADAPTER_CONFIG} there{hint}")


# --- the adapter -----------------------------------------------------------------------------


def clean_adapter_config(config: dict[str, Any], base_model: str, where: str) -> dict[str, Any]:
    if config.get("use_qalora"):
        raise ExportError(f"{where}: a QA-LoRA adapter only works on its quantized base; it cannot be exported")
    if config.get("init_lora_weights") == "loftq" or config.get("loftq_config"):
        raise ExportError(f"{where}: a LoftQ adapter is paired with LoftQ's modified base weights, not the base model")
    out = dict(config)
    out["base_model_name_or_path"] = base_model
    out["inference_mode"] = True
    return out


def load_adapter_tensors(adapter_dir: Path) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    if (adapter_dir / ADAPTER_WEIGHTS).is_file():
        tensors = load_file(str(adapter_dir / ADAPTER_WEIGHTS))
    elif (adapter_dir / ADAPTER_WEIGHTS_BIN).is_file():
        tensors = torch.load(adapter_dir / ADAPTER_WEIGHTS_BIN, map_location="cpu", weights_only=True)
    else:
        raise ExportError(f"{adapter_dir}: no {ADAPTER_WEIGHTS} (or {ADAPTER_WEIGHTS_BIN})")
    quantized = [k for k in tensors if any(m in k for m in QUANT_KEY_MARKERS)]
    if quantized:
        raise ExportError(
            f"{adapter_dir}: the adapter holds quantization state ({quantized[:3]}); it cannot be exported"
        )
    not_float = [k for k, v in tensors.items() if not torch.is_floating_point(v)]
    if not_float:
        raise ExportError(f"{adapter_dir}: non-floating-point adapter tensors {not_float[:3]} (quantized weights?)")
    return {k: v.contiguous() for k, v in tensors.items()}


def save_tokenizer(adapter_dir: Path, base_model: str, out: Path) -> str:
    """The run's tokenizer (saved with the adapter) or, failing that, the base model's."""
    from transformers import AutoTokenizer

    source = str(adapter_dir) if (adapter_dir / "tokenizer_config.json").is_file() else base_model
    AutoTokenizer.from_pretrained(source).save_pretrained(str(out))
    return source


def merge(adapter_dir: Path, base_model: str, out: Path, dtype: str = "auto") -> Path:
    """Load the base unquantized, apply the adapter, merge_and_unload, save as safetensors."""
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    if getattr(AutoConfig.from_pretrained(base_model), "quantization_config", None):
        raise ExportError(f"base model {base_model!r} is a quantized checkpoint; merge needs the full-precision one")
    torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch_dtype)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(out), safe_serialization=True)
    return out


# --- pushing ---------------------------------------------------------------------------------


def is_local_target(target: str) -> bool:
    """A target is a local folder when it is written as a path (absolute, ./, ../, ~, file://) or
    already exists; anything else (`user/name`) is a Hub repo id."""
    return target.startswith(("/", "./", "../", "~", "file://")) or Path(target).exists()


def push(folder: Path, target: str, *, private: bool = True, api: Any = None, message: str | None = None) -> str:
    """Upload `folder` to a Hub model repo (created if needed) through huggingface_hub, or mirror it
    into a local folder with the same semantics (files are added or replaced, others kept)."""
    message = message or f"vprl export of {folder.name}"
    if is_local_target(target):
        dest = Path(target.removeprefix("file://")).expanduser()
        shutil.copytree(folder, dest, dirs_exist_ok=True)
        return str(dest)
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    api.create_repo(target, repo_type="model", private=private, exist_ok=True)
    info = api.upload_folder(repo_id=target, folder_path=str(folder), repo_type="model", commit_message=message)
    return str(getattr(info, "commit_url", info))


# --- the export ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportResult:
    out: str
    adapter_source: str
    base_model: str
    quantization: str
    merged: str | None
    pushed: str | None
    weights_sha256: str
    push_error: str | None = None  # why --push_to_hub failed; `pushed` is then None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def export_run(
    run: str | Path,
    out: str | Path,
    *,
    adapter: str | None = None,
    base_model: str | None = None,
    merge_model: bool = False,
    dtype: str = "auto",
    push_to: str | None = None,
    private: bool = True,
    api: Any = None,
    evaluation: str | Path | None = None,
) -> ExportResult:
    """`evaluation`: an evaluation.json (or the folder holding it) of this adapter, whose headline
    figures go into the card as `model-index` results."""
    from safetensors.torch import save_file

    run, out = Path(run), Path(out)
    if not run.is_dir():
        raise ExportError(f"run folder {str(run)!r} does not exist")
    try:
        manifest = read_manifest(run)
        run_config = read_config(run)
    except RunFolderError as exc:
        raise ExportError(str(exc)) from None
    source = find_adapter(run, adapter)
    adapter_config = json.loads((source / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    base = base_model or policy_base_model(manifest, adapter_config)
    config = clean_adapter_config(adapter_config, base, str(source / ADAPTER_CONFIG))
    tensors = load_adapter_tensors(source)

    out.mkdir(parents=True, exist_ok=True)
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    save_file(tensors, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    tokenizer_source = save_tokenizer(source, base, out)
    digest = hashlib.sha256((out / ADAPTER_WEIGHTS).read_bytes()).hexdigest()

    merged_dir = None
    if merge_model:
        merged_dir = merge(out, base, out / "merged", dtype)
        save_tokenizer(out, base, merged_dir)
    result = ExportResult(
        out=str(out),
        adapter_source=str(source.relative_to(run)),
        base_model=base,
        quantization=policy_quantization(manifest),
        merged=str(merged_dir) if merged_dir else None,
        pushed=None,
        weights_sha256=digest,
    )
    card = render_model_card(
        run=run,
        manifest=manifest,
        config=run_config,
        metrics=MetricsLog(run).read(),
        rollouts=RolloutLog.in_run(run).read(),
        adapter_config=config,
        export=result.to_json() | {"tokenizer_source": tokenizer_source},
        evaluation=read_evaluation(evaluation) if evaluation else None,
    )
    card.save(str(out / "README.md"))
    if merged_dir:
        card.save(str(merged_dir / "README.md"))
    # export.json travels with the push, naming its destination; the local copy then gets the commit
    # URL, or, when the push failed, says it was not pushed and why.
    if push_to:
        result = replace(result, pushed=push_to)
    _write_export_json(out, result)
    if push_to:
        try:
            where = push(out, push_to, private=private, api=api)
        except Exception as exc:  # noqa: BLE001 — the Hub client raises its transport's errors (httpx), not OSError
            why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}".rstrip(": ")
            _write_export_json(out, replace(result, pushed=None, push_error=why))
            raise ExportError(
                f"--push_to_hub {push_to}: the push failed ({why}); the export is in {out}, "
                "its export.json says it was not pushed"
            ) from None
        result = replace(result, pushed=where)
        _write_export_json(out, result)
    return result


def _write_export_json(out: Path, result: ExportResult) -> None:
    (out / "export.json").write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m vprl.train.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="run folder written by vprl/train/rl.py")
    parser.add_argument("--out", required=True, help="folder to write the exported adapter to")
    parser.add_argument("--adapter", help="adapter folder inside the run (default: adapter)")
    parser.add_argument("--base_model", help="override the base model named in the manifest")
    parser.add_argument("--merge", action="store_true", help="also save base + adapter merged, as safetensors")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="dtype of the merged model (default: auto, the base model's)",
    )
    parser.add_argument("--push_to_hub", metavar="REPO_OR_PATH", help="Hub repo id (user/name) or a local folder")
    parser.add_argument("--public", action="store_true", help="create the Hub repo public (default private)")
    parser.add_argument(
        "--evaluation",
        help="evaluation.json (or its folder) of this adapter: its figures go into the card's model-index",
    )
    args = parser.parse_args(argv)
    try:
        result = export_run(
            args.run,
            args.out,
            adapter=args.adapter,
            base_model=args.base_model,
            merge_model=args.merge,
            dtype=args.dtype,
            push_to=args.push_to_hub,
            private=not args.public,
            evaluation=args.evaluation,
        )
    except (ExportError, OSError) as exc:  # OSError: a base model or file that cannot be read
        fail(str(exc))
    print(json.dumps(result.to_json(), indent=2))
    return 0
