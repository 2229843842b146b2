"""Adapter export: round trip (reloaded adapter and merged model reproduce the policy's logits), model
card, push to a local folder and to the Hub API, and QLoRA runs exporting for the unquantized base."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

import tiny_models as tiny  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from vprl.train.export.adapter import ExportError, export_run, main  # noqa: E402
from vprl.train.export.model_card import metric_summary  # noqa: E402
from vprl.train.rollouts.log import RolloutLog, RolloutRow  # noqa: E402
from vprl.train.runs.folder import write_manifest  # noqa: E402

# fp32 on CPU: the reloaded adapter runs the very same ops as the policy (bit-identical up to
# summation order); merging folds B@A into W, which changes rounding, hence the looser bound.
ADAPTER_ATOL = 1e-5
MERGED_ATOL = 1e-4


@pytest.fixture(scope="module")
def base_path(tmp_path_factory):
    return tiny.build("causal_lm", tmp_path_factory.mktemp("tiny_lm"))


def _inputs(path):
    tok = AutoTokenizer.from_pretrained(path)
    return tok(["what color is the red cat", "is there a dog on the table"], return_tensors="pt", padding=True)


def _logits(model, inputs):
    model.eval()
    with torch.no_grad():
        return model(**inputs).logits


def _make_run(run, base_path, quantization="none", adapter_rel="adapter"):
    """A run folder by the vprl/train/rl.py contract, holding a LoRA policy with non-zero B matrices."""
    from peft import LoraConfig, get_peft_model

    kwargs = {}
    if quantization == "4bit":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
        )
    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(base_path, **kwargs)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    policy = get_peft_model(base, lora)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:  # peft initialises B to 0; a trained adapter is not
                param.normal_(0, 0.5)
    policy.save_pretrained(run / adapter_rel)
    AutoTokenizer.from_pretrained(base_path).save_pretrained(run / adapter_rel)
    manifest = {  # the keys vprl/train/rl.py writes
        "algorithm": "grpo",
        "policy": {
            "base_model": base_path,
            "name": "tiny",
            "quantization": quantization,
            "load_in_4bit": quantization == "4bit",
            "lora": {"r": 4, "alpha": 8, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]},
        },
        "tool_stack": {"file": "oracle", "config": {"backend": "oracle", "min_visible": 0.5}},
        "prompt_hash": "0123456789abcdef",
        "prompt": {"vqa": {"variant": "vipergpt", "task": "vqa"}},
        "dataset": {"dataset": "shapes", "tasks": ["train"], "examples": 2, "split_id": "shapes:train-5f3a"},
        "rewards": {"rewards": [{"name": "correctness", "weight": 1.0}]},
        "seed": 7,
        "packages": {"torch": torch.__version__},
        "git": {"commit": "abc1234", "dirty": False},
    }
    write_manifest(run, manifest)
    (run / "config.yaml").write_text("algorithm: grpo\nlearning_rate: 0.0002\nlora_r: 4\n")
    metrics = [{"step": 1, "loss": 0.9, "reward": 0.2}, {"step": 2, "loss": 0.5, "reward": 0.6}]
    metrics.append({"step": 3, "loss": 0.7, "reward": 0.4})
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    RolloutLog.in_run(run).append(
        RolloutRow(step=s, example_id=f"e{i}", prompt_hash="h", program="p", status="ok", total=float(s * i))
        for s in (1, 2)
        for i in range(2)
    )
    return policy


def test_export_round_trip_merge_and_local_push(tmp_path, base_path):
    run = tmp_path / "run"
    policy = _make_run(run, base_path)
    inputs = _inputs(base_path)
    expected = _logits(policy, inputs)
    plain = _logits(AutoModelForCausalLM.from_pretrained(base_path), inputs)
    assert (expected - plain).abs().max() > 1e-2  # the adapter does change the model

    hub = tmp_path / "hub" / "user-model"
    assert main(["--run", str(run), "--out", str(tmp_path / "out"), "--merge", "--push_to_hub", str(hub)]) == 0
    out = tmp_path / "out"

    from peft import PeftModel

    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), str(out))
    assert torch.allclose(_logits(reloaded, inputs), expected, atol=ADAPTER_ATOL)
    merged = AutoModelForCausalLM.from_pretrained(out / "merged")
    assert not any("lora" in k for k in merged.state_dict())
    assert list((out / "merged").glob("*.safetensors"))
    assert torch.allclose(_logits(merged, inputs), expected, atol=MERGED_ATOL)

    card = (out / "README.md").read_text()
    for needed in (
        "library_name: peft",
        "grpo",
        "shapes:train-5f3a",
        "correctness",
        "learning_rate",
        "abc1234",
        "oracle",
    ):
        assert needed in card, needed
    assert "| reward | 0.4 (3) | 0.6 (2) |" in card and "| loss | 0.7 (3) | 0.5 (2) |" in card
    assert "final step 2 1" in card  # rollouts: step 2 totals 0 and 2 -> mean 1
    # the local "hub" target received the same folder, and loads like a Hub repo would
    assert sorted(p.name for p in hub.iterdir()) == sorted(p.name for p in out.iterdir())
    again = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), str(hub))
    assert torch.allclose(_logits(again, inputs), expected, atol=ADAPTER_ATOL)
    assert json.loads((out / "export.json").read_text())["pushed"] == str(hub)


def test_qlora_run_exports_an_adapter_for_the_fp32_base(tmp_path, base_path):
    pytest.importorskip("bitsandbytes")
    run = tmp_path / "run"
    policy = _make_run(run, base_path, quantization="4bit", adapter_rel="iterations/iter-2/adapter")
    trained = {k: v.detach().clone() for k, v in policy.state_dict().items() if "lora_" in k}
    with pytest.raises(ExportError, match="iterations/iter-2/adapter"):
        export_run(run, tmp_path / "nope")  # no <run>/adapter: the error lists the run's adapters
    result = export_run(run, tmp_path / "out", adapter="iterations/iter-2/adapter", merge_model=True)
    assert result.quantization == "4bit"
    config = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == base_path and not config["use_qalora"] and not config["loftq_config"]
    tensors = load_file(tmp_path / "out" / "adapter_model.safetensors")
    assert all(t.dtype == torch.float32 for t in tensors.values())
    assert not [k for k in tensors if "lora_" not in k]

    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(base_path)  # unquantized fp32
    assert not any("Linear4bit" in type(m).__name__ for m in base.modules())
    loaded = PeftModel.from_pretrained(base, str(tmp_path / "out"))
    state = loaded.state_dict()
    for key, value in trained.items():
        assert torch.equal(state[key], value), key
    inputs = _inputs(base_path)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "merged")
    assert torch.allclose(_logits(merged, inputs), _logits(loaded, inputs), atol=MERGED_ATOL)


def test_hub_push_goes_through_the_hub_api(tmp_path, base_path):
    class RecordingApi:
        def __init__(self):
            self.calls = []

        def create_repo(self, repo_id, **kwargs):
            self.calls.append(("create_repo", repo_id, kwargs))

        def upload_folder(self, **kwargs):
            self.calls.append(("upload_folder", kwargs["repo_id"], kwargs))
            return type("Info", (), {"commit_url": f"https://hf.co/{kwargs['repo_id']}/commit/1"})()

    run = tmp_path / "run"
    _make_run(run, base_path)
    api = RecordingApi()
    result = export_run(run, tmp_path / "out", push_to="someone/vprl-tiny", api=api)
    (create, upload) = api.calls
    assert create[:2] == ("create_repo", "someone/vprl-tiny") and create[2]["private"] and create[2]["exist_ok"]
    assert upload[2]["folder_path"] == str(tmp_path / "out") and upload[2]["repo_type"] == "model"
    assert result.pushed == "https://hf.co/someone/vprl-tiny/commit/1"


def test_bad_runs_give_clear_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:  # bad input: exit status 2, like every command's
        main(["--run", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    assert exit_.value.code == 2 and "does not exist" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    with pytest.raises(ExportError, match="no manifest.json"):
        export_run(tmp_path / "run", tmp_path / "o")
    (tmp_path / "run" / "manifest.json").write_text("{}")
    (tmp_path / "run" / "adapter").mkdir()
    (tmp_path / "run" / "adapter" / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": "x", "use_qalora": True})
    )
    with pytest.raises(ExportError, match="QA-LoRA"):
        export_run(tmp_path / "run", tmp_path / "o")


def test_metric_summary_directions():
    rows = [{"step": 1, "loss": 2.0, "eval/accuracy": 0.1, "lr": 1e-4}, {"step": 2, "loss": 3.0, "eval/accuracy": 0.3}]
    summary = {name: rest for name, *rest in metric_summary(rows)}
    assert summary["loss"] == [3.0, 2, 2.0, 1]
    assert summary["eval/accuracy"] == [0.3, 2, 0.3, 2]
    assert summary["lr"] == [1e-4, 1, None, None]


def test_zero_std_and_spread_metrics_have_no_best():
    """#29 item 3: the card's "best" column called frac_reward_zero_std 0.625 best (the word "reward")."""
    rows = [
        {"step": 1, "frac_reward_zero_std": 0.625, "reward_std": 0.2, "rewards/correctness/mean": 0.1},
        {"step": 2, "frac_reward_zero_std": 0.25, "reward_std": 0.4, "rewards/correctness/mean": 0.5},
    ]
    summary = {name: rest for name, *rest in metric_summary(rows)}
    assert summary["frac_reward_zero_std"][2:] == [None, None]
    assert summary["reward_std"][2:] == [None, None]
    assert summary["rewards/correctness/mean"][2:] == [0.5, 2]


def test_export_of_a_run_on_a_local_base_loads_from_anywhere(tmp_path, base_path, monkeypatch):
    """#29 item 3: a run started with a relative policy path (`runs/tiny_policy`) exported an adapter
    whose base_model_name_or_path only resolved from that folder; and `--push_to_hub` was refused
    while `--push_to_hub` worked."""
    import shutil

    from peft import AutoPeftModelForCausalLM

    work = tmp_path / "work"
    shutil.copytree(base_path, work / "models" / "base")
    monkeypatch.chdir(work)
    run = tmp_path / "run"
    policy = _make_run(run, "models/base")
    inputs = _inputs(base_path)
    hub = tmp_path / "hub"
    assert main(["--run", str(run), "--out", str(tmp_path / "out"), "--push_to_hub", str(hub)]) == 0
    config = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(work / "models" / "base")
    monkeypatch.chdir(tmp_path)
    loaded = AutoPeftModelForCausalLM.from_pretrained(str(tmp_path / "out"))
    assert torch.allclose(_logits(loaded, inputs), _logits(policy, inputs), atol=ADAPTER_ATOL)
    assert (hub / "adapter_config.json").is_file()


def test_export_card_carries_licence_prompt_and_evaluation(tmp_path, base_path):
    """#29 item 3: the card names the licence, shows the prompt format (not only its hash) and, given
    an evaluation, its figures as model-index metadata."""
    from huggingface_hub import ModelCard

    run = tmp_path / "run"
    _make_run(run, base_path)
    evaluation = {
        "headline": {"gqa": "exact_match", "winoground": "group"},
        "matrix": {
            "base": {"single": {"gqa": {"mean": 0.3, "std": 0.0, "seeds": 1}}},
            "after_rl": {"single": {"gqa": {"mean": 0.42, "std": 0.01, "seeds": 3}, "winoground": {"mean": 0.1}}},
        },
    }
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "evaluation.json").write_text(json.dumps(evaluation))
    assert main(["--run", str(run), "--out", str(tmp_path / "out"), "--evaluation", str(tmp_path / "eval")]) == 0
    card = ModelCard.load(str(tmp_path / "out" / "README.md"))
    assert card.data.license == "apache-2.0"  # the tiny policy is this project's own
    results = {(r.dataset_name, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert results == {("gqa", "exact_match"): 0.42, ("winoground", "group"): 0.1}
    assert "<QUESTION>" in card.text and "## Evaluation" in card.text
    with pytest.raises(SystemExit):
        main(["--run", str(run), "--out", str(tmp_path / "o2"), "--evaluation", str(tmp_path / "missing")])


@pytest.mark.parametrize("failure", ["offline", "unreachable"])
def test_item6_a_failed_push_is_one_line_and_export_json_says_not_pushed(
    tmp_path, base_path, monkeypatch, capsys, failure
):
    import huggingface_hub
    import huggingface_hub.constants

    class Unreachable:
        def create_repo(self, *args, **kwargs):
            raise OSError(101, "Network is unreachable") if failure == "offline" else _connect_error()

    monkeypatch.setattr(huggingface_hub, "HfApi", Unreachable)
    run, out = tmp_path / "run", tmp_path / "out"
    _make_run(run, base_path)
    with pytest.raises(SystemExit) as exit_:
        main(["--run", str(run), "--out", str(out), "--push_to_hub", "someone/vprl-tiny"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]  # the policy's loading bars come first
    assert exit_.value.code == 2 and "Traceback" not in err, err
    assert lines[-1].startswith("error: --push_to_hub someone/vprl-tiny: the push failed ("), lines[-1]
    record = json.loads((out / "export.json").read_text())
    assert record["pushed"] is None and "unreachable" in record["push_error"].lower()


def _connect_error():
    """What huggingface_hub's client raises with the network unreachable: its transport's error, no OSError."""
    import httpx

    return httpx.ConnectError("[Errno 101] Network is unreachable")
