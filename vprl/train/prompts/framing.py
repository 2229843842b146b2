"""Model framing: turn a prompt into the text and token ids a particular code LLM expects.

- CodeLlama-style (no chat template): the prompt is plain text and the tokenizer's post-processor
  adds `<s>` itself.
- CodeGemma-style (chat template): the prompt goes into a user turn; the template already emits
  `<bos>`, so the framed text is tokenized without special tokens.

Either way `encode_prompt` returns ids with exactly one BOS, at position 0. Pass these ids (not the
text) to generators that tokenize on their own, such as vLLM, which would otherwise add a second
BOS in front of a chat-templated text.

The prompt ends with the entry point's signature (`def execute_command(image) -> str:`), and the
model continues the function body from there. In a chat frame that signature line is moved into
the start of the model's turn, so the completion is a body in both frames and
`completion_to_program` treats them alike.

A prompt holding repair turns (`vprl/train/prompts/conversation.py`: after the first program, a
feedback block under its header at column 0 and the signature again, per turn) is framed as a
multi-turn chat: the prompt in a user turn, each program (signature and body) in a model turn, each
feedback block's comment lines in a user turn, and the last model turn left open with the signature
as its prefill. The plain frame keeps the text as it is.
"""

from __future__ import annotations

from typing import Any

from vprl.executor.program import ENTRY, extract_program

STYLES = ("auto", "plain", "chat")

# Where a completion of the function body ends: the next top-level comment (a new query), def,
# class or script line, a closing markdown fence, or two blank lines in a row.
STOP_SEQUENCES: tuple[str, ...] = (
    "\n\n\n",
    "\n#",
    "\ndef ",
    "\nclass ",
    "\nif __name__",
    "\nprint(",
    "\n```",
    "\nQuery:",
    "\nProgram:",
)


# The line that opens a repair turn's feedback block (vprl.train.prompts.conversation): at column 0,
# where a program body never has a line (`\n#` is a stop sequence).
HEADER = "# Feedback on the program above:"


def resolve_style(tokenizer: Any, style: str = "auto") -> str:
    """ "plain" or "chat"; "auto" picks "chat" when the tokenizer has a chat template."""
    if style not in STYLES:
        raise ValueError(f"framing style {style!r} is not one of {STYLES}")
    if style != "auto":
        return style
    return "chat" if getattr(tokenizer, "chat_template", None) and not _adds_nothing(tokenizer) else "plain"


def _adds_nothing(tokenizer: Any) -> bool:
    """Whether the chat template writes the turns' contents and nothing else (apart from a BOS): a
    base model's stand-in template (verl renders every prompt through one), which is plain framing."""
    turns = [{"role": "user", "content": "Q\x01"}, {"role": "assistant", "content": "A\x02"}]
    try:
        rendered = tokenizer.apply_chat_template(turns, tokenize=False)
    except Exception:  # a template that cannot render this pair is a real chat template's business
        return False
    bos = getattr(tokenizer, "bos_token", None) or ""
    return isinstance(rendered, str) and rendered.removeprefix(bos).strip() == "Q\x01A\x02"


def frame_prompt(prompt: str, tokenizer: Any, style: str = "auto") -> str:
    """The text to feed the model. It never adds a BOS to plain text (the tokenizer does that in
    `encode_prompt`), and a BOS already at the start of the prompt is not repeated by the chat
    template."""
    style = resolve_style(tokenizer, style)
    bos = getattr(tokenizer, "bos_token", None)
    if style == "plain":
        return prompt
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("framing style 'chat' needs a tokenizer with a chat template")
    content = prompt[len(bos) :] if bos and prompt.startswith(bos) else prompt
    turns = repair_turns(content)
    if turns is None:
        content, prefill = _split_signature(content)
        turns = [content, prefill]
    *closed, prefill = turns
    messages = [{"role": "user" if k % 2 == 0 else "assistant", "content": text} for k, text in enumerate(closed)]
    framed = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(framed, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(framed).__name__}, expected str")
    return framed + prefill


def turn_end_ids(tokenizer: Any, style: str = "auto") -> list[int]:
    """The token that ends the model's turn in a chat frame (CodeGemma's `<end_of_turn>`), as a
    one-element list; empty for plain framing, or when the template closes the turn with text only.

    Stop strings cannot stand for it: they are matched on text decoded with special tokens skipped,
    where it leaves nothing. It is found by rendering a model turn and taking the first token after
    its content that decodes to nothing without special tokens."""
    if resolve_style(tokenizer, style) != "chat":
        return []
    marker = "MARKER"
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Q"}, {"role": "assistant", "content": marker}], tokenize=False
    )
    if not isinstance(rendered, str) or marker not in rendered:
        raise ValueError("the chat template does not render a model turn's content; cannot find where the turn ends")
    after = rendered[rendered.rindex(marker) + len(marker) :]
    for token in tokenizer(after, add_special_tokens=False)["input_ids"]:
        if tokenizer.decode([token], skip_special_tokens=True) == "":
            return [int(token)]
    return []


def encode_prompt(text: str, tokenizer: Any) -> list[int]:
    """Token ids of a framed prompt with exactly one BOS, at position 0 (when the tokenizer has a
    BOS token at all).

    Text that already starts with the BOS text (a chat template's output) is tokenized without
    special tokens; other text with them, so the tokenizer adds BOS the way the model was trained.
    A post-processor that adds no BOS gets one prepended; one that appends EOS has it removed,
    since a prompt must not end the sequence.
    """
    bos, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    if bos is None or bos_id is None:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    has_bos_text = text.startswith(bos)
    ids = list(tokenizer(text, add_special_tokens=not has_bos_text)["input_ids"])
    if not has_bos_text:
        eos, eos_id = getattr(tokenizer, "eos_token", None), getattr(tokenizer, "eos_token_id", None)
        if eos_id is not None and ids and ids[-1] == eos_id and not (eos and text.endswith(eos)):
            ids.pop()
        if not ids or ids[0] != bos_id:
            ids.insert(0, bos_id)
    count = ids.count(bos_id)
    if count != 1:
        where = [i for i, t in enumerate(ids) if t == bos_id]
        raise ValueError(
            f"the prompt encodes to {count} BOS tokens (at positions {where[:5]}); the text holds the BOS "
            f"text {bos!r} somewhere after its start"
        )
    return ids


def completion_to_program(prompt_tail: str, completion: str) -> str:
    """The runnable program for a completion of a prompt ending with the entry point's signature.

    `prompt_tail` is the prompt (or its last line). When it ends with a `def` line the completion
    is the function body and the signature is put back in front; a completion that writes the
    whole `def execute_command` itself is taken as it is. The text is cut at the first stop
    sequence after the signature, then cleaned with `vprl.executor.program.extract_program`.
    """
    last_line = prompt_tail.rstrip().rsplit("\n", 1)[-1].strip()
    entry = f"def {ENTRY}"
    if last_line.startswith("def ") and not _opens_with_entry(completion):
        text = last_line + completion
        body_from = len(last_line)
    else:
        text = completion
        body_from = max(completion.find(entry), 0)
    cut = min((i for i in (text.find(s, body_from) for s in STOP_SEQUENCES) if i >= 0), default=len(text))
    return extract_program(text[:cut])


def _opens_with_entry(completion: str) -> bool:
    """Whether the completion writes the entry point itself (first code line, after a fence)."""
    lines = [line for line in completion.split("\n") if line.strip()]
    if lines and lines[0].lstrip().startswith("```"):
        lines = lines[1:]
    return bool(lines) and lines[0].startswith(f"def {ENTRY}")


def repair_turns(prompt: str) -> list[str] | None:
    """The chat turns of a prompt holding repair turns, or None when it holds none: [user (the
    prompt up to the signature), model (the signature and the first program's body), then per
    feedback block a user turn (the block's comment lines) and a model turn (the signature and what
    follows)]; the last model turn is the open one."""
    marker = "\n" + HEADER
    if marker not in prompt:
        return None
    first, *blocks = prompt.split(marker)
    at = first.rfind("\ndef ")
    if at < 0:
        raise ValueError("a prompt with repair turns has no signature before its first feedback block")
    turns = [first[:at].rstrip("\n"), first[at + 1 :]]
    for block in blocks:
        block = HEADER + block
        at = block.find("\ndef ")
        if at < 0:
            raise ValueError(f"a feedback block is not followed by the signature: {block[:80]!r}")
        turns += [block[:at].rstrip("\n"), block[at + 1 :]]
    return turns


def _split_signature(prompt: str) -> tuple[str, str]:
    """(prompt without its final `def ...:` line, that line) when the prompt ends with one."""
    head, _, last = prompt.rstrip().rpartition("\n")
    if last.startswith("def ") and last.rstrip().endswith(":"):
        return head.rstrip("\n"), last
    return prompt, ""
