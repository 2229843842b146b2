"""The language-model routines of the API (`llm_query`, `select_answer`): text in, text out, no image.
Kept apart from the image classes, which call them, so that neither side imports the other."""

from __future__ import annotations

import numpy as np

from vprl.executor.api.context import current_client
from vprl.executor.api.errors import expect_str, expect_str_list


def llm_query(question: str, long_answer: bool = True) -> str:
    """Answer a question with a language model, for outside knowledge the image cannot give.
    The question should be self-contained text (no "the image"); put the objects you found
    into it with an f-string. With `long_answer=False` the answer is a short phrase.

    >>> # what is the dessert on the plate usually eaten with?
    >>> dessert = image_patch.find("dessert")[0].simple_query("What is this?")
    >>> return llm_query(f"What is {dessert} usually eaten with?", long_answer=False)
    """
    expect_str("llm_query", "question", question)
    if not long_answer:
        question = f"{question} Answer in a few words."
    return str(current_client().call("llm", None, None, {"prompt": question}))


def select_answer(info, question: str, possible_answers: list[str]) -> str:
    """Pick the most plausible of `possible_answers` to `question` given `info`, a string or a
    dict of facts gathered from the image or video (uses a language model).

    >>> info = {"caption of the last frame": last_frame.simple_query("What is happening?")}
    >>> return select_answer(info, question, possible_answers)
    """
    options = expect_str_list("select_answer", "possible_answers", possible_answers)
    expect_str("select_answer", "question", question)
    lines = [f"Information: {info}", f"Question: {question}", "Options:"]
    lines += [f"{i}. {o}" for i, o in enumerate(options)]
    lines.append("Reply with the text of the best option only.")
    reply = str(current_client().call("llm", None, None, {"prompt": "\n".join(lines)})).strip().lower()
    for option in options:  # exact option text first, then the option whose words the reply contains
        if reply == option.lower():
            return option
    scores = [sum(w in reply for w in option.lower().split()) for option in options]
    return options[int(np.argmax(scores))]


def process_guesses(question: str, guess1: str = None, guess2: str = None) -> str:
    """Combine two candidate answers to a question (e.g. a direct visual answer and a
    language-model answer) into one final short answer. A list of guesses also works.

    >>> guess1 = image_patch.simple_query(question)
    >>> guess2 = llm_query(f"{question} The image shows {image_patch.simple_query()}.", long_answer=False)
    >>> return process_guesses(question, guess1, guess2)
    """
    # ViperGPT's OK-VQA example passes all guesses as one list.
    raw = list(guess1) if isinstance(guess1, (list, tuple)) else [guess1, guess2]
    guesses = [str(g) for g in raw if g]
    if len({g.strip().lower() for g in guesses}) < 2:
        return guesses[0] if guesses else ""
    listed = " and ".join(f"'{g}'" for g in guesses)
    count = "Two" if len(guesses) == 2 else str(len(guesses))
    prompt = f"Question: {question}\n{count} candidate answers: {listed}.\nGive the better short answer."
    return str(current_client().call("llm", None, None, {"prompt": prompt}))
