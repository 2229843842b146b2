"""#34 item 6: a chat frame's turn end (CodeGemma's `<end_of_turn>`) ends a completion.

Stop strings are matched on text decoded with special tokens skipped, where `<end_of_turn>` leaves
nothing, and it was no EOS: completions ran on past it into an invented next turn, and those tokens
were trained with the program's advantage. These tests build a Gemma-like chat tokenizer and a tiny
policy that often draws `<end_of_turn>`, and look at what trl hands the loss after generation.
"""

from __future__ import annotations

import pytest
import torch
from chat_helpers import TEXTS, build_chat_tokenizer, build_turn_end_policy
from fake_vllm import PolicyVLLMGeneration

from vprl.train.online.trainers import ProgramGRPOTrainer, stop_at_turn_end, stop_cut, stop_length
from vprl.train.policy.tiny import train_tokenizer
from vprl.train.prompts import STOP_SEQUENCES, frame_prompt, turn_end_ids


@pytest.fixture(scope="module")
def chat_tokenizer():
    return build_chat_tokenizer()


def test_item6_turn_end_of_a_chat_frame_is_found(chat_tokenizer):
    eot = chat_tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert turn_end_ids(chat_tokenizer) == [eot]  # auto: the tokenizer has a chat template
    assert turn_end_ids(chat_tokenizer, "plain") == []
    assert turn_end_ids(train_tokenizer(TEXTS, vocab_size=320)) == []  # no template: plain framing
    assert chat_tokenizer.decode([eot], skip_special_tokens=True) == ""  # why no stop string can see it


def test_item6_stop_length_cuts_through_the_turn_end(chat_tokenizer):
    eot = chat_tokenizer.convert_tokens_to_ids("<end_of_turn>")
    body = chat_tokenizer("\n    return 'no'", add_special_tokens=False)["input_ids"]
    after = chat_tokenizer("\n<start_of_turn>user\nx = 1", add_special_tokens=False)["input_ids"]
    ids = [*body, eot, *after]
    assert stop_length(ids, chat_tokenizer, STOP_SEQUENCES) == len(ids)  # the stop strings do not see it
    assert stop_length(ids, chat_tokenizer, STOP_SEQUENCES, [eot]) == len(body) + 1
    # ended by the turn end even when it is the last token (the length limit's): not a cut program
    assert stop_cut([*body, eot], chat_tokenizer, STOP_SEQUENCES, [eot]) == (len(body) + 1, True)
    assert stop_cut(body, chat_tokenizer, STOP_SEQUENCES, [eot]) == (len(body), False)
    early = chat_tokenizer("\n# next", add_special_tokens=False)["input_ids"]
    assert stop_length([*early, eot], chat_tokenizer, STOP_SEQUENCES, [eot]) < len(early) + 1  # first stop wins


def _trainer(tmp_path, tokenizer, use_vllm: bool):
    from datasets import Dataset
    from trl import GRPOConfig

    model = build_turn_end_policy(tokenizer)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=24,
        temperature=1.0,
        use_cpu=True,
        bf16=False,
        report_to="none",
        use_vllm=use_vllm,
        **({"vllm_mode": "colocate"} if use_vllm else {}),
    )
    stop_at_turn_end(model, args, turn_end_ids(tokenizer))
    prompt = frame_prompt("# how many circles?\ndef execute_command(image) -> str:", tokenizer)
    trainer = ProgramGRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": prompt}] * 8),
        processing_class=tokenizer,
    )
    trainer.setup_program_training(STOP_SEQUENCES, False, stop_token_ids=turn_end_ids(tokenizer))
    return trainer, [{"prompt": prompt}] * 8


class RunsPastStopIds(PolicyVLLMGeneration):
    """A vLLM engine that was not given the stop token ids (a server started by hand)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stop_ids = set()


@pytest.mark.parametrize("path", ["transformers", "vllm", "vllm-without-stop-ids"])
def test_item6_generation_stops_at_the_turn_end_and_nothing_after_it_reaches_the_loss(
    tmp_path, monkeypatch, chat_tokenizer, path
):
    """Transformers' generate stops at the turn end (an EOS of the generation config), vLLM stops at
    it (a stop token id), and a sampler that runs past it anyway (a server given no stop ids) is cut
    there: in what trl hands the loss, the turn end is a completion's last unmasked token."""
    import trl.trainer.grpo_trainer as grpo_trainer

    eot = chat_tokenizer.convert_tokens_to_ids("<end_of_turn>")
    if path != "transformers":
        engine = RunsPastStopIds if path == "vllm-without-stop-ids" else PolicyVLLMGeneration
        monkeypatch.setattr(grpo_trainer, "VLLMGeneration", engine)
    torch.manual_seed(0)
    trainer, inputs = _trainer(tmp_path, chat_tokenizer, use_vllm=path != "transformers")
    if path != "transformers":
        assert trainer.vllm_generation.kwargs["generation_kwargs"]["stop_token_ids"] == [eot]
    assert eot in trainer.eos_token_ids
    output = trainer._generate_and_score_completions(inputs)
    ids, mask = output["completion_ids"], output["completion_mask"]
    ended_at_turn = 0
    for row in range(ids.size(0)):
        kept = ids[row][mask[row].bool()].tolist()
        assert mask[row, len(kept) :].sum() == 0  # the mask is a prefix
        if eot in kept:
            ended_at_turn += 1
            assert kept.index(eot) == len(kept) - 1, (path, kept)  # nothing after it is trained
    assert ended_at_turn > 0
