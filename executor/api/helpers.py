"""Module-level functions of the image API (ViperGPT's helpers). Docstrings are shown to the LLM."""

from __future__ import annotations

import re

import numpy as np

from executor.api.context import current_client
from executor.api.errors import expect_str, expect_str_list
from executor.api.patch import ImagePatch


def best_image_match(list_patches: list[ImagePatch], content: list[str], return_index: bool = False):
    """Return the patch that best matches the content (a list of phrases, all of which should
    match), or its index when `return_index` is True. Returns None for an empty list.

    >>> # the kid wearing a pink scarf and blue pants
    >>> kids = image_patch.find("kid")
    >>> return best_image_match(kids, ["pink scarf", "blue pants"])
    """
    texts = expect_str_list("best_image_match", "content", [content] if isinstance(content, str) else content)
    if not list_patches:
        return None
    if not all(isinstance(p, ImagePatch) for p in list_patches):
        raise TypeError("best_image_match() expects a list of ImagePatch")
    # Every phrase should hold, so a patch's score is the mean over phrases.
    scores = [float(np.mean(p._tool("itm", texts=texts))) for p in list_patches]
    index = int(np.argmax(scores))
    return index if return_index else list_patches[index]


def distance(patch_a: ImagePatch, patch_b: ImagePatch) -> float:
    """Pixel distance between the edges of two patches; when they overlap, minus their IoU
    (so overlapping patches are always "closer" than separate ones).

    >>> # the cup closest to the laptop
    >>> laptop = image_patch.find("laptop")[0]
    >>> cups = image_patch.find("cup")
    >>> return min(cups, key=lambda cup: distance(cup, laptop))
    """
    if not isinstance(patch_a, ImagePatch) or not isinstance(patch_b, ImagePatch):
        raise TypeError(
            f"distance() expects two ImagePatch, got {type(patch_a).__name__} and {type(patch_b).__name__}"
        )
    dx = max(patch_b.left - patch_a.right, patch_a.left - patch_b.right, 0)
    dy = max(patch_b.lower - patch_a.upper, patch_a.lower - patch_b.upper, 0)
    if dx == 0 and dy == 0:
        inter_w = min(patch_a.right, patch_b.right) - max(patch_a.left, patch_b.left)
        inter_h = min(patch_a.upper, patch_b.upper) - max(patch_a.lower, patch_b.lower)
        inter = max(inter_w, 0) * max(inter_h, 0)
        union = patch_a.area + patch_b.area - inter
        return -inter / union if union > 0 else 0.0
    return float(np.hypot(dx, dy))


def bool_to_yesno(bool_answer: bool) -> str:
    """ "yes" if the value is true, "no" otherwise.

    >>> return bool_to_yesno(image_patch.exists("cat"))
    """
    return "yes" if bool_answer else "no"


def coerce_to_numeric(string, no_string: bool = False):
    """Turn a string such as "2", "about 3.5 kg" or "1,000" into a number (int when whole);
    returns the string unchanged (or None when `no_string`) if it holds no number.

    >>> # how many more apples than oranges?
    >>> return str(coerce_to_numeric(apples.simple_query("How many?")) - 2)
    """
    if isinstance(string, (int, float)) and not isinstance(string, bool):
        return string
    text = str(string).replace(",", "")
    match = re.search(r"-?\d+(?:\.\d+)?", text)
    if match is None:
        words = {
            "zero": 0,
            "one": 1,
            "two": 2,
            "three": 3,
            "four": 4,
            "five": 5,
            "six": 6,
            "seven": 7,
            "eight": 8,
            "nine": 9,
            "ten": 10,
        }
        for word in re.findall(r"[a-z]+", text.lower()):
            if word in words:
                return words[word]
        return None if no_string else string
    value = float(match.group())
    return int(value) if value.is_integer() else value


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
