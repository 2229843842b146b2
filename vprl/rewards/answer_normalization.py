"""The official VQA answer normalisation, and the conversion of program answers to answer text.

`normalize_answer` follows the VQAv2 evaluation script (`vqaEval.py`, GT-Vision-Lab/VQA), step by
step, so that scores computed here match the published metric:

1. newlines and tabs become spaces; surrounding whitespace is stripped;
2. `processPunctuation`: each mark in `_PUNCTUATION` is deleted when it touches a space somewhere in
   the text (or when the text holds a digit-comma-digit run, e.g. "1,000"), and otherwise becomes a
   space ("t-shirt" -> "t shirt"). A period is deleted unless a digit follows it ("2.5" stays,
   "yes." -> "yes"). Apostrophes and colons are not in the official list and survive;
3. `processDigitArticle`: lower-case, split on whitespace, map number words zero..ten (and "none")
   to digits, drop the articles a/an/the, expand the contractions table ("dont" -> "don't"), and
   join with single spaces.

Two documented quirks of the official script, and what we do with them:
- its period regex is `(?!<=\\d)(\\.)(?!\\d)`, a mistyped look-behind that only checks the character
  *after* the period; we keep that effective behaviour (delete a period unless a digit follows);
- it passes `re.UNICODE` as the `count` argument of `re.sub`, capping deletions at 32 periods; we
  do not reproduce that cap (it only matters for answers with more than 32 periods).
The contractions table is copied as data, including its odd entries ("somebody'd" -> "somebodyd"
and capitalised keys such as "Im" that never fire because the text is lower-cased first).
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["CONTRACTIONS", "NUMBER_WORDS", "ARTICLES", "normalize_answer", "answer_to_text"]

CONTRACTIONS: dict[str, str] = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't",
    "dont": "don't", "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't",
    "havent": "haven't", "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's",
    "howd": "how'd", "howll": "how'll", "hows": "how's", "Id've": "I'd've", "I'dve": "I'd've", "Im": "I'm",
    "Ive": "I've", "isnt": "isn't", "itd": "it'd", "itd've": "it'd've", "it'dve": "it'd've", "itll": "it'll",
    "let's": "let's", "maam": "ma'am", "mightnt": "mightn't", "mightnt've": "mightn't've",
    "mightn'tve": "mightn't've", "mightve": "might've", "mustnt": "mustn't", "mustve": "must've",
    "neednt": "needn't", "notve": "not've", "oclock": "o'clock", "oughtnt": "oughtn't",
    "ow's'at": "'ow's'at", "'ows'at": "'ow's'at", "'ow'sat": "'ow's'at", "shant": "shan't",
    "shed've": "she'd've", "she'dve": "she'd've", "she's": "she's", "shouldve": "should've",
    "shouldnt": "shouldn't", "shouldnt've": "shouldn't've", "shouldn'tve": "shouldn't've",
    "somebody'd": "somebodyd", "somebodyd've": "somebody'd've", "somebody'dve": "somebody'd've",
    "somebodyll": "somebody'll", "somebodys": "somebody's", "someoned": "someone'd",
    "someoned've": "someone'd've", "someone'dve": "someone'd've", "someonell": "someone'll",
    "someones": "someone's", "somethingd": "something'd", "somethingd've": "something'd've",
    "something'dve": "something'd've", "somethingll": "something'll", "thats": "that's",
    "thered": "there'd", "thered've": "there'd've", "there'dve": "there'd've", "therere": "there're",
    "theres": "there's", "theyd": "they'd", "theyd've": "they'd've", "they'dve": "they'd've",
    "theyll": "they'll", "theyre": "they're", "theyve": "they've", "twas": "'twas", "wasnt": "wasn't",
    "wed've": "we'd've", "we'dve": "we'd've", "weve": "we've", "werent": "weren't", "whatll": "what'll",
    "whatre": "what're", "whats": "what's", "whatve": "what've", "whens": "when's", "whered": "where'd",
    "wheres": "where's", "whereve": "where've", "whod": "who'd", "whod've": "who'd've", "who'dve": "who'd've",
    "wholl": "who'll", "whos": "who's", "whove": "who've", "whyll": "why'll", "whyre": "why're",
    "whys": "why's", "wont": "won't", "wouldve": "would've", "wouldnt": "wouldn't",
    "wouldnt've": "wouldn't've", "wouldn'tve": "wouldn't've", "yall": "y'all", "yall'll": "y'all'll",
    "y'allll": "y'all'll", "yall'd've": "y'all'd've", "y'alld've": "y'all'd've", "y'all'dve": "y'all'd've",
    "youd": "you'd", "youd've": "you'd've", "you'dve": "you'd've", "youll": "you'll", "youre": "you're",
    "youve": "you've",
}  # fmt: skip

# The official `manualMap`: "none" counts as zero, so "none" and "0" agree on counting questions.
NUMBER_WORDS: dict[str, str] = {
    "none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
    "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10",
}  # fmt: skip

ARTICLES: frozenset[str] = frozenset({"a", "an", "the"})

# The official `punct` list, in its order. The period is handled separately (see module docstring).
_PUNCTUATION: tuple[str, ...] = (
    ";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!",
)  # fmt: skip
_COMMA_BETWEEN_DIGITS = re.compile(r"(\d)(,)(\d)")
_PERIOD_NOT_BEFORE_DIGIT = re.compile(r"\.(?!\d)")


def _process_punctuation(text: str) -> str:
    """The official `processPunctuation`: delete or space out each mark, then drop stray periods."""
    # Both tests look at the *input* text, not the partly processed one, exactly as the script does.
    has_digit_comma = _COMMA_BETWEEN_DIGITS.search(text) is not None
    out = text
    for mark in _PUNCTUATION:
        if has_digit_comma or (mark + " ") in text or (" " + mark) in text:
            out = out.replace(mark, "")
        else:
            out = out.replace(mark, " ")
    return _PERIOD_NOT_BEFORE_DIGIT.sub("", out)


def _process_digit_article(text: str) -> str:
    """The official `processDigitArticle`: lower-case, number words to digits, no articles, contractions."""
    words = []
    for word in text.lower().split():
        word = NUMBER_WORDS.get(word, word)
        if word not in ARTICLES:
            words.append(CONTRACTIONS.get(word, word))
    return " ".join(words)


def normalize_answer(text: str) -> str:
    """Normalise an answer string the way the VQAv2 evaluation script does (see module docstring)."""
    if not isinstance(text, str):
        raise TypeError(f"normalize_answer expects a str, got {type(text).__name__}: {text!r}")
    text = text.replace("\n", " ").replace("\t", " ").strip()
    return _process_digit_article(_process_punctuation(text))


def answer_to_text(answer: Any) -> str | None:
    """The answer text a program's JSON answer stands for, or None when it is not a scalar answer.

    Booleans become "yes"/"no" (programs often return `True` for a yes/no question). Integral
    numbers print without a fractional part (2.0 -> "2") so they meet the digit form the
    normalisation gives "two"; other finite floats use `repr` (2.5 -> "2.5"). None, NaN, infinities,
    lists and boxes have no answer text.
    """
    if isinstance(answer, bool):  # before int: bool is a subclass of int
        return "yes" if answer else "no"
    if isinstance(answer, int):
        return str(answer)
    if isinstance(answer, float):
        if not math.isfinite(answer):
            return None
        return str(int(answer)) if answer.is_integer() else repr(answer)
    if isinstance(answer, str):
        return answer
    return None
