"""From (question, answer) to what the verifiers check: a *claim*.

ExoViP verifies a candidate answer with three templates ([E] §3.2): ITM matches "a photo of" +
the answer, captioning compares the caption with "the image describe" + the (question, answer)
pair rewritten as a declarative sentence, and VQA asks a yes/no question about the answer. For a
whole program's final answer we rewrite the pair by rule (GQA-style questions; no LLM needed):

    "What color is the triangle left of the star?", "orange"
        phrase     "the orange triangle left of the star"     (ITM: "a photo of" + phrase)
        statement  "the triangle left of the star is orange"  (caption similarity)
        questions  ("is the triangle left of the star orange?",)  (VQA: P(yes) - P(no))
        slots      ("orange",)                                (contrasted with their opposites)

A yes/no answer asserts (yes, polarity +1) or denies (no, -1) the question's own statement; its
slots are the statement's vocabulary words, each swapped for its opposite in turn to make the
contrast. Questions no rule covers fall back to ExoViP's literal templates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from vprl.executor.tools.vocabulary import GENERIC_NOUNS
from vprl.rewards.correctness import yes_no

SLOT = "\x00"  # where the answer goes in a wh-claim's templates
# Words that end a noun phrase: relations and locative heads.
_NP_END = frozenset({"to", "above", "below", "near", "left", "right", "on", "in", "of", "next", "behind", "under"})


@dataclass(frozen=True)
class Claim:
    phrase: str  # what ITM matches (without the "a photo of" template)
    statement: str  # declarative sentence for caption similarity
    questions: tuple[str, ...]  # yes/no questions for the VQA verifier; () when none can be posed
    polarity: int = 1  # +1: the answer asserts the claim; -1: it denies it ("no")
    slots: tuple[str, ...] = ()  # words that carry the answer, contrasted with their opposites
    yes_no: bool = False  # the answer was yes/no: VQA contrasts by polarity, not by slots
    any_of: bool = False  # the questions are alternatives ("either ... or"): VQA takes the max, else the min

    alternatives: tuple[str, ...] = ()  # the question's own options ("x or y"): the answer's contrasts
    templates: tuple[str, ...] = ()  # phrase, statement, *questions with the answer as SLOT (wh answers)

    def swap(self, word: str, opposite: str) -> Claim:
        """The same claim with `word` replaced by `opposite`: in the answer's slot when the claim
        was built around an answer (so "the hexagon" in "what color is the hexagon" stays put when
        the answer is "hexagon"), else everywhere as a whole word."""
        if self.templates and self.slots and word == self.slots[0]:
            phrase, statement, *questions = (t.replace(SLOT, opposite) for t in self.templates)
            return replace(self, phrase=phrase, statement=statement, questions=tuple(questions))
        pattern = re.compile(rf"(?<![a-z0-9]){re.escape(word)}(?![a-z0-9])")
        sub = lambda text: pattern.sub(opposite, text)  # noqa: E731
        return replace(
            self, phrase=sub(self.phrase), statement=sub(self.statement), questions=tuple(map(sub, self.questions))
        )


def build_claim(question: str, answer_text: str, known_words: frozenset[str] | set[str] = frozenset()) -> Claim:
    """The claim that `answer_text` makes about the image in answer to `question`.

    `known_words` is the opposite vocabulary: a yes/no claim's slots are the known words it contains.
    """
    q = _clean(question)
    a = _clean(answer_text)
    polar = yes_no(a)
    if polar is not None:
        claim = _yes_no_claim(q)
        slots = tuple(w for w in _words(claim.phrase) if w in known_words)
        return replace(claim, polarity=1 if polar == "yes" else -1, slots=slots, yes_no=True)
    templated = _wh_claim(q, SLOT)
    texts = (templated.phrase, templated.statement, *templated.questions)
    phrase, statement, *questions = (t.replace(SLOT, a) for t in texts)
    return replace(
        templated, phrase=phrase, statement=statement, questions=tuple(questions), slots=(a,), templates=texts
    )


def text_claim(text: str, known_words: frozenset[str] | set[str] = frozenset(), polarity: int = 1) -> Claim:
    """A claim that the image (or region) shows `text` (grounding expressions, ITM captions)."""
    text = _clean(text)
    slots = tuple(w for w in _words(text) if w in known_words)
    return Claim(text, f"there is {text}", (f"is there {text}?",), polarity, slots)


def _yes_no_claim(q: str) -> Claim:
    m = re.match(r'^(?:verify )?(?:the )?image matches text ?= ?"?(?P<t>.+?)"?$', q)
    if m:
        text = m["t"]
        return Claim(text, f"there is {text}", (f"is there {text}?",))
    m = re.match(r"^(?:is|are) there (?P<kind>both|either) (?P<x>.+?) (?:and|or) (?P<y>.+)$", q)
    if m:
        # Conjunctions and disjunctions are asked part by part: a VQA model answers one thing at a time.
        x, y, either = m["x"], m["y"], m["kind"] == "either"
        text = f"{x} {'or' if either else 'and'} {y}"
        return Claim(text, f"there is {text}", (f"is there {x}?", f"is there {y}?"), any_of=either)
    m = re.match(r"^(?:is|are) there (?P<t>.+)$", q)
    if m:
        text = m["t"]
        return Claim(text, f"there is {text}", (q + "?",))
    m = re.match(r"^are there more (?P<x>.+) than (?P<y>.+)$", q)
    if m:
        return Claim(f"{m['x']} and {m['y']}", f"there are more {m['x']} than {m['y']}", (q + "?",))
    m = re.match(r"^(?:is|are) (?P<np>the .+) (?P<v>[a-z]+)$", q)
    if m and not m["np"].endswith((" or", " and")):
        np_, value = m["np"], m["v"]
        return Claim(_insert(value, np_), f"{np_} is {value}", (q + "?",))
    m = re.match(r"^(?:do|does|is|are|can|has|have) (?P<t>.+)$", q)
    text = m["t"] if m else q
    return Claim(text, text, (q + "?",))


# "Is X in the top or bottom half / on the left or right side of the image?": the claim names the region.
_IMAGE_REGIONS = (
    (
        r"^(?:is|are) (?P<np>.+) in the (?P<x>top|bottom) or (?P<y>top|bottom) half of the image$",
        "in the {} half of the image",
    ),
    (
        r"^(?:is|are) (?P<np>.+) on the (?P<x>left|right) or (?P<y>left|right) side of the image$",
        "on the {} side of the image",
    ),
)


def _wh_claim(q: str, a: str) -> Claim:
    slots = (a,)
    m = re.match(r"^what (?P<attr>colou?r|size|material) (?:is|are) (?P<np>.+)$", q) or re.match(
        r"^what is the (?P<attr>colou?r|size|material) of (?P<np>.+)$", q
    )
    if m:
        np_ = m["np"]
        return Claim(_insert(a, np_), f"{np_} is {a}", (f"is {np_} {a}?",), slots=slots)
    m = re.match(r"^what (?:shape|kind of object|object|type of object) is (?P<np>.+)$", q) or re.match(
        r"^what is the shape of (?P<np>.+)$", q
    )
    if m:
        np_ = m["np"]
        return Claim(_replace_head(a, np_), f"{np_} is a {a}", (f"is {np_} a {a}?",), slots=slots)
    for pattern, where in _IMAGE_REGIONS:
        m = re.match(pattern, q)
        if m:
            place = where.format(a)
            return Claim(
                f"{m['np']} {place}",
                f"{m['np']} is {place}",
                (f"is {m['np']} {place}?",),
                slots=slots,
                alternatives=(m["x"], m["y"]),
            )
    m = re.match(r"^(?:is|are) (?P<np>the .+?) (?P<x>[a-z]+) or (?P<y>[a-z]+)$", q)
    if m:
        np_ = m["np"]
        return Claim(_insert(a, np_), f"{np_} is {a}", (f"is {np_} {a}?",), slots=slots, alternatives=(m["x"], m["y"]))
    m = re.match(r"^how many (?P<np>.+?)(?: are there| are in the image| can you see)?$", q)
    if m:
        np_ = m["np"]
        return Claim(f"{a} {np_}", f"there are {a} {np_}", (f"are there {a} {np_}?",), slots=slots)
    # ExoViP's literal templates: "a photo of" + answer; the pair as a sentence; no VQA question.
    return Claim(a, f"{q} {a}", (), slots=slots)


def _insert(word: str, np_: str) -> str:
    """Put `word` before the head noun of the first noun phrase: "the star left of ..." -> "the red star left of ..."."""
    tokens = np_.split()
    end = next((i for i, t in enumerate(tokens) if t in _NP_END and i > 0), len(tokens))
    return " ".join([*tokens[: end - 1], word, *tokens[end - 1 :]])


def _replace_head(word: str, np_: str) -> str:
    """Name the head noun: "the blue object" -> "the blue hexagon"; a non-generic head gets `word` inserted."""
    tokens = np_.split()
    end = next((i for i, t in enumerate(tokens) if t in _NP_END and i > 0), len(tokens))
    if tokens and tokens[end - 1].rstrip("s") in GENERIC_NOUNS:
        return " ".join([*tokens[: end - 1], word, *tokens[end:]])
    return _insert(word, np_)


def _clean(text: str) -> str:
    text = text.strip().lower().replace("\u2019", "'")
    text = re.sub(r"\s+", " ", text)
    return text.rstrip("?.! ").strip()


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text)
