"""What each reported number means: the official metrics' names and the other conventions beside them.

Every number an evaluation report shows has a name here and a line saying whose convention it is
(docs/references.md#metrics-official-and-reported has the sources). The official ones are computed
as the dataset's official script computes them; the others are named for who uses them:

- `vipergpt_*`: ViperGPT's evaluation code ([V]'s public repository, `datasets/`);
- `normalised_match`: vprl's training reward (`vprl/rewards/correctness.py`), VQA normalisation on both
  the answer and the reference: more lenient than any official metric;
- `item_accuracy`, `both_right`, `category_mean`: ours, named for what they count.

Also here: how ViperGPT turns a program's answer into a GQA prediction and a RefCOCO box, so the
variants named after it reproduce its code rather than our reading of it.
"""

from __future__ import annotations

from typing import Any

from vprl.rewards.answer_normalization import normalize_answer
from vprl.rewards.correctness import parse_box

# ViperGPT's RefCOCO evaluation puts this box (left, lower, right, upper, pixels, origin bottom-left)
# where a program failed; its comment gives the mean IoU of this box alone as 22.64%.
VIPERGPT_MEAN_BOX = (50.9, 39.1, 493.5, 356.5)
VIPERGPT_ACC_ABOVE = 0.7  # ViperGPT's RefCOCO accuracy counts IoU strictly above this

# family -> metric name -> what it is; "official" marks the dataset's own metric.
DESCRIPTIONS: dict[str, dict[str, str]] = {
    "gqa": {
        "accuracy": "official (GQA eval.py): prediction == answer as strings, balanced questions only",
        "binary": "official (GQA eval.py): accuracy on balanced questions whose structural type is not query",
        "open": "official (GQA eval.py): accuracy on balanced questions whose structural type is query",
        "vipergpt_accuracy": "ViperGPT's code: the prediction post-processed (a failed program's None "
        "becomes 'no', then VQA normalisation), the answer as is, every question given",
        "normalised_match": "vprl's training reward: VQA normalisation of prediction and answer, every "
        "question given (lenient: 'a metal', 'Silver' and 'no.' match)",
    },
    "sugarcrepe": {
        "<category>": "official (SugarCREPE main_eval.py): share of entries whose positive caption scores "
        "strictly higher than the negative (a yes scores 1, anything else 0: a failed program counts as no)",
        "category_mean": "ours: unweighted mean of the official category accuracies (the official script "
        "reports the categories only)",
        "both_right": "vprl's former headline, stricter: the positive answered yes and the negative no "
        "(a failed program is wrong), mean over categories",
        "item_accuracy": "ours: per-caption yes/no accuracy over every caption",
    },
    "winoground": {
        "text": "official (Winoground): for each image, the matching caption scores strictly higher",
        "image": "official (Winoground): for each caption, the matching image scores strictly higher",
        "group": "official (Winoground): text and image both (all three equal for yes/no answers: see the note)",
        "item_accuracy": "ViUniT's per-pairing yes/no accuracy over the four pairings of each example",
    },
    "grounding": {
        "acc50": "accuracy at IoU >= 0.5, the REC convention; a failed program scores IoU 0",
        "miou": "mean IoU, what ViperGPT and Stanic et al. report; a failed program scores IoU 0",
        "vipergpt_miou": "ViperGPT's code: mean IoU with a failed program's box replaced by its mean box",
        "vipergpt_acc70": "ViperGPT's code: share with IoU > 0.7, a failed program's box replaced by its mean box",
    },
    "nextqa": {
        "accuracy": "official (NExT-QA eval_mc.py): the chosen option is the answer, over all questions",
        "causal": "official (NExT-QA eval_mc.py): accuracy on causal questions (CW, CH)",
        "temporal": "official (NExT-QA eval_mc.py): accuracy on temporal questions (TN, TC, with TP in TN)",
        "descriptive": "official (NExT-QA eval_mc.py): accuracy on descriptive questions (DC, DL, DO)",
        "normalised_match": "vprl's training reward: the answer's text equals the right option after VQA normalisation",
    },
    "vqa": {
        "vqa_accuracy": "official (VQA vqaEval.py): min(matching annotators / 3, 1) over the 10 leave-one-out subsets",
    },
    "other": {
        "accuracy": "vprl: exact match after VQA normalisation (no official metric for this dataset)",
    },
}


# family -> what a reader of its numbers must know beyond each name's line.
NOTES: dict[str, str] = {
    "winoground": "text, image and group are the same number in every cell, by definition: a program's "
    "yes/no answer scores a pairing 1 or 0, and with 0/1 scores each of the three is right only when all "
    "four pairings of an example are answered right (they differ for graded scores such as CLIP's)",
}

# rate name -> what it counts. Every rate is a share of the dataset's questions unless it says otherwise.
RATES: dict[str, str] = {
    "exception_rate": "share of questions whose answering program raised (a syntax or runtime error) or "
    "returned an answer of the wrong kind for the task (bad_return)",
    "timeout_rate": "share whose answering program ran out of time",
    "infra_error_rate": "share lost to our own failure (the executor or a tool), not the program's",
    "refusal_rate": "share whose answer the mode refused (best of n by unit tests with refuse_below); a "
    "refused answer counts as wrong",
    "fallback_rate": "share answered by the end-to-end fallback instead of the program: only in '+fallback' "
    "rows, 0 in the others",
    "mean_attempts": "programs executed per question to reach its answer (candidates, retries, re-prompts)",
    "right_for_wrong_reason": "of the questions answered right (score >= 0.5 by the training reward's match) "
    "whose program has a unit-test score, the share scoring below 0.5 on its unit tests",
}

# Field of a predictions.jsonl row -> what it holds (beyond the Prediction's own fields).
PREDICTION_FIELDS: dict[str, str] = {
    "query": "the question, caption query or referring expression the program answered",
    "gold": "the reference: the answers (VQA's ten annotators, GQA's one, yes/no for matching) or the box",
    "score": "the program's answer scored by the training reward's match (vprl/rewards/correctness.py: VQA soft "
    "accuracy, IoU for a box, normalised exact match otherwise); 0 with no answer",
    "correct": "score >= 0.5, the verdict the report's rates use; not the official per-dataset rule (GQA's "
    "official accuracy compares strings as they are; Winoground and SugarCREPE score whole groups)",
    "score_with_fallback": "the same for the answer the '+fallback' row uses (only in runs with the fallback)",
    "correct_with_fallback": "score_with_fallback >= 0.5",
}


def description(family: str, name: str) -> str:
    """What metric `name` of a dataset of this family is and whose convention it follows."""
    table = DESCRIPTIONS.get(family, {})
    if name in table:
        return table[name]
    return table.get("<category>", DESCRIPTIONS["other"].get(name, ""))


def vipergpt_gqa_prediction(answer: Any) -> str:
    """The string ViperGPT's GQA accuracy compares with the answer: its general post-processing
    (the first element of a list, "no" for None or an empty list, yes/no for a bool, lower case,
    "true"/"false" as yes/no), then the VQA punctuation, number-word and article rules. The answer
    it is compared with is not normalised."""
    if isinstance(answer, list):
        answer = answer[0] if answer else "no"
    if answer is None:
        answer = "no"
    if isinstance(answer, bool):
        answer = "yes" if answer else "no"
    text = str(answer).replace("\n", " ").replace("\t", " ").strip().lower()
    text = {"true": "yes", "false": "no"}.get(text, text)
    return normalize_answer(text)


def vipergpt_box(answer: Any) -> tuple[float, float, float, float] | None:
    """The box ViperGPT's RefCOCO accuracy reads from an answer: its mean box for None (a failed
    program), the box of a patch, a list of four numbers as a box; None (IoU 0) for anything else."""
    if answer is None:
        return VIPERGPT_MEAN_BOX
    if isinstance(answer, list) and len(answer) == 4:
        return parse_box({"box": answer})
    return parse_box(answer)
