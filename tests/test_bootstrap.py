"""The tiny code policy: bare prompts, its tokenizer (one BOS), the SFT mixture, and a bootstrap
run that writes a loadable policy, caches it, and evaluates it through the sandboxed executor."""

import json
import subprocess
import sys

import background_jobs
import numpy as np
import pytest
import torch

from vprl.data.records import Example
from vprl.paths import CHECKOUT
from vprl.train.bootstrap.check import PolicyEval
from vprl.train.bootstrap.fit import BootstrapConfig, ensure_tiny_policy, main
from vprl.train.bootstrap.mixture import plan_mixture
from vprl.train.bootstrap.pairs import body
from vprl.train.policy.tiny import TinyModelConfig, build_model, load_policy, parameter_count, train_tokenizer
from vprl.train.prompts import PromptConfig, build_prompt, completion_to_program, encode_prompt, frame_prompt

GOLD = {
    "Is the circle in the top or bottom half of the image?": (
        "def execute_command(image):\n    image_patch = ImagePatch(image)\n"
        '    obj = image_patch.find("circle")[0]\n'
        '    return "top" if obj.vertical_center > image_patch.vertical_center else "bottom"\n'
    ),
    "What color is the star?": (
        "def execute_command(image):\n    image_patch = ImagePatch(image)\n"
        '    obj = image_patch.find("star")[0]\n    return obj.simple_query("What color is the star?")\n'
    ),
}


def test_bare_layout_is_query_and_signature_only():
    assert build_prompt("What color is the star?", PromptConfig(layout="bare")) == (
        "# What color is the star?\ndef execute_command(image) -> str:"
    )
    assert build_prompt("the star", PromptConfig(layout="bare", task="grounding")).endswith("-> ImagePatch:")
    with pytest.raises(ValueError, match="bare"):
        PromptConfig(layout="bare", ice_file="x.jsonl")
    assert PromptConfig.from_json(PromptConfig(layout="bare").to_json()).layout == "bare"


def test_tokenizer_gives_one_bos_and_round_trips(tmp_path):
    texts = [build_prompt(q, PromptConfig(layout="bare")) + body(p) for q, p in GOLD.items()] * 20
    tok = train_tokenizer(texts, vocab_size=400, context=128)
    tok.save_pretrained(str(tmp_path))
    model = build_model(
        tok,
        TinyModelConfig(vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, context=128),
    )
    model.save_pretrained(str(tmp_path))
    model, tok = load_policy(tmp_path)
    prompt = build_prompt("What color is the star?", PromptConfig(layout="bare"))
    ids = encode_prompt(frame_prompt(prompt, tok, "auto"), tok)
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1 and tok.eos_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == prompt
    program = GOLD["What color is the star?"]
    assert tok.decode(tok(program, add_special_tokens=False)["input_ids"]) == program
    assert parameter_count(model) > 0 and model.config.bos_token_id == tok.bos_token_id


def _examples(n):
    queries = list(GOLD)
    return [
        Example(id=f"e{i}", dataset="gqa", task="vqa", query=queries[i % 2], image="x.png", answers=["a"],
                group=["position_vertical", "query_color"][i % 2])
        for i in range(n)
    ]  # fmt: skip


def test_mixture_makes_weak_families_mostly_wrong_and_strong_mostly_gold():
    cfg = BootstrapConfig(out="unused", weak_share=0.5, gold_weak=0.2, gold_strong=0.9, dominant=1.0, copies=3)
    pairs, plan = plan_mixture(_examples(400), GOLD, cfg, np.random.default_rng(0))
    assert len(pairs) == 1200 and sum(p["weak"] for p in plan.values()) == 1
    for family, info in plan.items():
        share = info["targets"].get("gold", 0) / (info["questions"] * cfg.copies)
        if info["weak"]:
            assert abs(share - 0.2) < 0.06 and info["targets"][info["dominant"]] > 0.7 * info["questions"] * 3
        else:
            assert abs(share - 0.9) < 0.06, (family, share)
    pair = pairs[0]
    assert pair.prompt.endswith("-> str:") and completion_to_program(pair.prompt, pair.completion).startswith("def ")


TINY = [
    "--world_train", "40", "--world_val", "10", "--copies", "1", "--max_steps", "3", "--batch_size", "8",
    "--vocab_size", "400", "--hidden_size", "32", "--num_layers", "1", "--num_heads", "2",
    "--intermediate_size", "64", "--context", "256", "--eval_val", "4", "--eval_heldout", "3",
    "--num_generations", "2", "--max_completion_length", "24", "--tool_stack", "oracle",
]  # fmt: skip


def test_tiny_bootstrap_writes_a_loadable_policy_and_caches(tmp_path, capsys):
    out = tmp_path / "policy"
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:  # `threads` is the bootstrap's: whoever trains next in the process gets its own count back
        summary = main(["--out", str(out), "--seed", "1", *TINY, "--threads", "1"])
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(threads)
    saved = json.loads((out / "bootstrap.json").read_text())
    assert saved["key"] == summary["key"] and saved["seed"] == 1 and saved["training"]["steps"] == 3
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert set(saved["evaluation"]) == {"val", "heldout"}
    val = PolicyEval.from_json(saved["evaluation"]["val"])
    assert val.overall.n == 4 and val.overall.gold == 1.0 and val.k == 2
    assert 0 <= val.overall.greedy <= 1 and val.overall.pass_at_k >= 0
    assert saved["mixture"] and all("targets" in v for v in saved["mixture"].values())
    head = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert saved["git"]["commit"] == (head.stdout.strip() if CHECKOUT and head.returncode == 0 else None)
    model, tok = load_policy(out)
    assert model.config.num_hidden_layers == 1 and tok.bos_token == "<|bos|>"
    assert model.config.use_cache and model.generation_config.use_cache  # decoders load it with the KV cache
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    again = main(["--out", str(out), "--seed", "1", *TINY])
    assert "nothing to do" in capsys.readouterr().out and again["key"] == summary["key"]
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime
    cfg = BootstrapConfig(out=str(out), seed=1, **{TINY[i][2:]: _num(TINY[i + 1]) for i in range(0, len(TINY), 2)})
    assert ensure_tiny_policy(cfg) == out and (out / "model.safetensors").stat().st_mtime_ns == mtime


FULL_BOOTSTRAP = background_jobs.register(
    "full_bootstrap",
    lambda out: [sys.executable, "-m", "vprl.train.bootstrap", "--out", str(out / "policy"), "--seed", "0",
                 "--tool_stack", "oracle", "--eval_heldout", "0", "--threads", "1"],
)  # fmt: skip


def _num(text):
    try:
        return int(text)
    except ValueError:
        return text


@pytest.mark.background(FULL_BOOTSTRAP)
@pytest.mark.timeout(900)  # run alone, the test waits out the whole job (about 150 s, more on a slow box)
def test_full_bootstrap_starts_imperfect_but_promising():
    """The default recipe: greedy well below the gold ceiling on the training families, and samples
    that find the gold often enough (pass@8 well above greedy) for RL to have something to raise.
    The recipe's training as it is; of its evaluation only the training families' (the held-out
    families' is not asserted here, and the tiny bootstrap above evaluates both). Its command line
    runs beside the suite (tests/background_jobs.py), at one torch thread: two on a busy 2-core box
    spin (over 300 s where one takes about 150; threads are not in the recipe)."""
    done = background_jobs.result(FULL_BOOTSTRAP)
    assert done.returncode == 0, done.log_tail
    summary = json.loads((done.out / "policy" / "bootstrap.json").read_text())
    val = PolicyEval.from_json(summary["evaluation"]["val"]).overall
    assert (
        summary["config"]["seed"] == 0 and summary["key"] == BootstrapConfig(tool_stack="oracle", eval_heldout=0).key()
    )
    assert val.gold == 1.0 and 0.1 <= val.greedy <= 0.6
    assert val.sampled >= 0.1 and val.pass_at_k >= val.greedy + 0.2
