"""Model framing: exactly one BOS for CodeLlama-like and Gemma-like tokenizers; completions to programs."""

from __future__ import annotations

import ast

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from vprl.executor.program import extract_program  # noqa: E402
from vprl.train.prompts import (  # noqa: E402
    STOP_SEQUENCES,
    PromptConfig,
    build_prompt,
    completion_to_program,
    encode_prompt,
    frame_prompt,
)
from vprl.train.prompts.framing import resolve_style  # noqa: E402
from vprl.train.prompts.render import render_api  # noqa: E402

GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def _bpe(specials: list[str], bos: str | None) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([render_api("abstract")] * 2, trainer=trainer)
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    return tok


@pytest.fixture(scope="module")
def llama_like():
    """CodeLlama-like: no chat template; the post-processor adds `<s>`."""
    tok = _bpe(["<unk>", "<s>", "</s>"], bos="<s>")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", padding_side="left"
    )


@pytest.fixture(scope="module")
def gemma_like():
    """CodeGemma-like: `<bos>` added by the post-processor and emitted by the chat template too."""
    tok = _bpe(["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"], bos="<bos>")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", padding_side="left"
    )
    fast.chat_template = GEMMA_TEMPLATE
    return fast


@pytest.fixture(scope="module")
def prompt():
    return build_prompt("how many red circles are there?", PromptConfig())


def _assert_one_bos_first(ids, tokenizer):
    assert ids[0] == tokenizer.bos_token_id
    assert ids.count(tokenizer.bos_token_id) == 1


def test_llama_like_plain_text_gets_exactly_one_bos(llama_like, prompt):
    framed = frame_prompt(prompt, llama_like)  # auto -> plain: no chat template
    assert framed == prompt and not framed.startswith("<s>")
    ids = encode_prompt(framed, llama_like)
    _assert_one_bos_first(ids, llama_like)
    assert llama_like.decode(ids[1:]) == prompt


def test_gemma_like_chat_frame_gets_exactly_one_bos(gemma_like, prompt):
    framed = frame_prompt(prompt, gemma_like)  # auto -> chat
    assert framed.startswith("<bos><start_of_turn>user\nimport math\n")
    # The signature opens the model's turn, so the model continues the function body.
    assert framed.endswith(
        "# how many red circles are there?<end_of_turn>\n<start_of_turn>model\ndef execute_command(image) -> str:"
    )
    ids = encode_prompt(framed, gemma_like)
    _assert_one_bos_first(ids, gemma_like)
    # What the naive call would do: the template's <bos> plus the post-processor's.
    assert gemma_like(framed)["input_ids"][:2] == [gemma_like.bos_token_id] * 2


@pytest.mark.parametrize("fixture", ["llama_like", "gemma_like"])
def test_prompt_already_starting_with_bos_text_is_not_doubled(request, fixture, prompt):
    tokenizer = request.getfixturevalue(fixture)
    with_bos = tokenizer.bos_token + prompt
    framed = frame_prompt(with_bos, tokenizer)
    assert not framed.startswith(tokenizer.bos_token * 2)
    _assert_one_bos_first(encode_prompt(framed, tokenizer), tokenizer)
    _assert_one_bos_first(encode_prompt(with_bos, tokenizer), tokenizer)


def test_explicit_styles(gemma_like, llama_like, prompt):
    assert frame_prompt(prompt, gemma_like, style="plain") == prompt
    _assert_one_bos_first(encode_prompt(frame_prompt(prompt, gemma_like, style="plain"), gemma_like), gemma_like)
    with pytest.raises(ValueError, match="chat template"):
        frame_prompt(prompt, llama_like, style="chat")
    with pytest.raises(ValueError, match="framing style"):
        frame_prompt(prompt, llama_like, style="chatml")


def test_bos_text_inside_the_prompt_is_an_error(llama_like):
    with pytest.raises(ValueError, match="2 BOS tokens"):
        encode_prompt("# a query <s> with a stray token\ndef execute_command(image) -> str:", llama_like)


def test_tokenizer_without_bos_post_processor_gets_bos_prepended_and_no_trailing_eos():
    tok = _bpe(["<s>", "</s>"], bos=None)
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A $B </s>", special_tokens=[("</s>", tok.token_to_id("</s>"))]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", padding_side="left")
    ids = encode_prompt("# a query\ndef execute_command(image) -> str:", fast)
    _assert_one_bos_first(ids, fast)
    assert ids[-1] != fast.eos_token_id


# ---------------------------------------------------------------- completions


SIGNATURE = "def execute_command(image) -> str:"
BODY = '\n    image_patch = ImagePatch(image)\n    # count them\n    return str(len(image_patch.find("cat")))'


def test_body_completion_is_joined_to_the_signature_and_cut_at_the_next_example(prompt):
    completion = BODY + "\n\n# how many dogs?\ndef execute_command(image) -> str:\n    return '2'\n"
    program = completion_to_program(prompt, completion)
    assert program == SIGNATURE + BODY + "\n"
    ast.parse(program)


@pytest.mark.parametrize(
    "tail",
    ["\n\n\n    x = 1", "\nprint(execute_command(image))", "\n```\nThis counts cats.", "\nclass Foo:\n    pass"],
)
def test_stop_sequences_end_the_program(tail):
    assert completion_to_program(SIGNATURE, BODY + tail) == SIGNATURE + BODY + "\n"


def test_completion_that_writes_the_whole_function(gemma_like, prompt):
    framed = frame_prompt(prompt, gemma_like)
    completion = f"```python\n{SIGNATURE}{BODY}\n```\nThe function counts the cats."
    assert completion_to_program(framed, completion) == SIGNATURE + BODY + "\n"
    assert completion_to_program("Program:", f"{SIGNATURE}{BODY}\n") == SIGNATURE + BODY + "\n"


def test_indented_comments_do_not_stop_and_result_matches_extract_program():
    program = completion_to_program(SIGNATURE, BODY)
    assert "# count them" in program
    assert program == extract_program(SIGNATURE + BODY)
    assert all(s.startswith("\n") or s.startswith("<") for s in STOP_SEQUENCES)


def test_a_template_that_writes_only_the_contents_is_plain_framing(llama_like, prompt):
    # verl renders every prompt through a chat template; a base model's recipe gives it one that
    # adds nothing, which must not turn the repair blocks into chat turns
    llama_like.chat_template = "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"
    try:
        assert resolve_style(llama_like) == "plain" and frame_prompt(prompt, llama_like) == prompt
    finally:
        llama_like.chat_template = None


def test_a_real_chat_template_is_chat_framing(gemma_like):
    assert resolve_style(gemma_like) == "chat"
