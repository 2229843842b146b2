"""The repair conversation's text: what follows a program that gets feedback, and how the programs
of an episode are read back out of its text.

An episode is one token sequence: the prompt, the first program (the body of `execute_command`),
then for each repair turn a feedback block and the next program. The block is environment text
(masked out of the loss): the feedback as comment lines under a fixed header, an instruction, and
the turn's opener again (`opener_of`: the query comment and the signature, the prompt's last
block), so the policy writes the next body right after what it saw before its first one, with the
question at hand rather than hundreds of tokens back. In a chat frame the block closes the model's
turn, puts the feedback in a user turn and opens a new model turn with the signature (rendered by
the tokenizer's own template).

The header starts at column 0 and a program body cannot contain a line that does (`\\n#` is a stop
sequence), so the last header in an episode's text marks where its final program starts.
"""

from __future__ import annotations

from typing import Any

from vprl.executor.program import ENTRY
from vprl.rewards.feedback import MAX_FEEDBACK_CHARS, Feedback
from vprl.train.prompts.framing import HEADER, completion_to_program, resolve_style

INSTRUCTION = "# Write the function again, fixing what the feedback shows."
# A feedback block's tokens at most, for memory and context plans: the message is at most
# MAX_FEEDBACK_CHARS characters (about 3 per token of code at worst), plus the header, the
# instruction and the opener (the query and the signature).
FEEDBACK_TOKENS = MAX_FEEDBACK_CHARS // 3 + 128


def episode_tokens(max_turns: int, max_completion_length: int) -> int:
    """The completion tokens of an episode at most: every turn's program and the blocks between."""
    return max_turns * max_completion_length + (max_turns - 1) * FEEDBACK_TOKENS


_MARK = "\x00turn\x00"


def feedback_comment(feedback: Feedback) -> str:
    """The header, the feedback's lines as comments and the instruction."""
    lines = [HEADER, *(f"# {line}" if line else "#" for line in feedback.text.splitlines()), INSTRUCTION]
    return "\n".join(lines)


def plain_block(feedback: Feedback, opener: str) -> str:
    """A plain frame's block after the newline that ends a program: the comment, the opener."""
    return f"{feedback_comment(feedback)}\n{opener}"


def signature_of(prompt: str) -> str:
    """The entry point's `def` line a prompt ends with (plain frame) or its model turn opens with
    (chat frame: the framing moves it there)."""
    last = prompt.rstrip().rsplit("\n", 1)[-1].strip()
    if not last.startswith(f"def {ENTRY}") or not last.endswith(":"):
        raise ValueError(f"the prompt does not end with the entry point's signature: {last[-80:]!r}")
    return last


def opener_of(prompt: str) -> str:
    """What the policy read just before its first program: the prompt's last block (an optional
    context comment, the query as a comment or a `Query:`/`Program:` pair, the signature) in a plain
    frame; the signature alone where that block holds anything else (a chat frame's turn markers)."""
    signature = signature_of(prompt)
    head = prompt.rstrip().rsplit("\n\n", 1)[-1].split("\n")[:-1]
    if head and all(line.startswith("#") or line == "Program:" for line in head):
        return "\n".join([*head, signature])
    return signature


class RepairFormat:
    """Feedback blocks for one tokenizer and framing. `block_ids(feedback, opener, after_turn_end)`
    gives the block's token ids, tokenized on their own and appended to the sampled ids as they are
    (the sampled tokens are never re-tokenized); `opener` is `opener_of(prompt)` (or the signature
    alone); `after_turn_end` says whether the program's tokens already end with the chat frame's
    turn-end token."""

    def __init__(self, tokenizer: Any, style: str = "auto"):
        self.tokenizer = tokenizer
        self.style = resolve_style(tokenizer, style)

    def block_text(
        self, feedback: Feedback, opener: str, after_turn_end: bool = True, after_newline: bool = False
    ) -> str:
        """`after_newline`: the program's text already ends with a newline. Either way the text reads
        the same: the body, one newline, the header (`conversation_text`). In a chat frame the
        opener's comment lines go in the user turn and its signature opens the model's."""
        if self.style == "plain":
            return ("" if after_newline else "\n") + plain_block(feedback, opener)
        head, _, signature = opener.rpartition("\n")
        comment = feedback_comment(feedback) + (f"\n{head}" if head else "")
        return self._chat_block(comment, after_turn_end) + signature

    def block_ids(
        self, feedback: Feedback, opener: str, after_turn_end: bool = True, after_newline: bool = False
    ) -> list[int]:
        text = self.block_text(feedback, opener, after_turn_end, after_newline)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _chat_block(self, comment: str, after_turn_end: bool) -> str:
        """What the template writes between the end of a model turn's content and the start of the
        next model turn's, around a user turn holding `comment`."""
        messages = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": _MARK}]
        both = self.tokenizer.apply_chat_template(
            [*messages, {"role": "user", "content": comment}], tokenize=False, add_generation_prompt=True
        )
        if not isinstance(both, str) or _MARK not in both:
            raise ValueError("the chat template does not render a model turn's content; cannot frame feedback")
        after = both[both.rindex(_MARK) + len(_MARK) :]
        if after_turn_end:
            ended = self.tokenizer.apply_chat_template(messages, tokenize=False)
            closing = ended[ended.rindex(_MARK) + len(_MARK) :]
            # The model's own turn-end token is already in its tokens: keep only what follows it.
            turn_end = closing.split("\n", 1)[0]
            if turn_end and after.startswith(turn_end):
                after = after[len(turn_end) :]
        return after


def body_of(program: str) -> str:
    """The program's text after its entry point's `def` line (what the policy wrote after the
    signature), starting with a newline; the whole program indented when it has no such line."""
    lines = program.rstrip("\n").split("\n")
    at = next((k for k, line in enumerate(lines) if line.startswith(f"def {ENTRY}")), None)
    if at is None:
        return "\n" + "\n".join("    " + line if line.strip() else line for line in lines)
    return "\n" + "\n".join(lines[at + 1 :])


def conversation_text(prompt: str, bodies: list[str], feedbacks: list[Feedback]) -> str:
    """A plain-framed episode as text, for a context built from programs rather than sampled tokens
    (the evaluation's repair mode, the bootstrap's repair examples): the prompt, each body (what
    follows the signature) without trailing newlines, each feedback block after it, then the next
    body; `bodies` has one more entry than `feedbacks` when the last program is written too."""
    if not len(feedbacks) <= len(bodies) <= len(feedbacks) + 1:
        raise ValueError(f"{len(bodies)} bodies do not go with {len(feedbacks)} feedback messages")
    opener = opener_of(prompt)
    text = prompt
    for k, body in enumerate(bodies):
        text += body.rstrip("\n")
        if k < len(feedbacks):
            text += "\n" + plain_block(feedbacks[k], opener)
    return text


def turn_texts(completion: str) -> list[str]:
    """An episode's text (everything after the prompt) split into its turns' texts: the first turn's
    body, then each later turn from its `def` line on."""
    pieces = completion.split("\n" + HEADER)
    out = [pieces[0]]
    for piece in pieces[1:]:
        at = piece.find(f"def {ENTRY}")
        out.append(piece[at:] if at >= 0 else "")
    return out


def episode_programs(prompt: str, completion: str) -> list[str]:
    """The programs of an episode, in turn order."""
    texts = turn_texts(completion)
    return [completion_to_program(prompt, texts[0]), *(completion_to_program("", t) for t in texts[1:])]


def final_program(prompt: str, completion: str) -> str:
    """The program an episode ends with: what its reward scores (the reward adapter's `to_program`
    in a repair run). For a one-turn completion, `completion_to_program` itself."""
    return episode_programs(prompt, completion)[-1]
