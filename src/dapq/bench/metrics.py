"""Scoring functions of the benchmarks, each as its benchmark's official code defines it.

Every function takes a prediction and a list of references and returns a float in [0, 1].
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

from rapidfuzz import fuzz


# --------------------------------------------------------------------------- RULER
def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """RULER: the fraction of references that appear (case-insensitively) in the prediction."""
    pred = prediction.lower()
    return sum(ref.lower() in pred for ref in references) / len(references)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """RULER (QA tasks): 1 if any reference appears in the prediction."""
    pred = prediction.lower()
    return float(max(ref.lower() in pred for ref in references))


def exact_number_match(prediction: str, references: Sequence[str]) -> float:
    """1.0 when the first number in the prediction is the reference number."""
    found = re.findall(r"\d+", prediction.replace(",", ""))
    return float(bool(found) and found[0] == references[0])


def rouge1_recall(prediction: str, references: Sequence[str]) -> float:
    """Unigram recall of the reference sentence (the sentence-needle NIAH metric)."""
    ref = _tokens(references[0])
    pred = Counter(_tokens(prediction))
    if not ref:
        return 0.0
    overlap = sum(min(c, pred[w]) for w, c in Counter(ref).items())
    return overlap / len(ref)


# --------------------------------------------------------------------------- LongBench
def normalize_answer(s: str) -> str:
    """LongBench / SQuAD normalisation: lower case, no punctuation, articles or extra spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _f1(pred_tokens: list[str], ref_tokens: list[str]) -> float:
    common = Counter(pred_tokens) & Counter(ref_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def qa_f1(prediction: str, references: Sequence[str]) -> float:
    """LongBench qa_f1_score: token F1 after normalisation, best over references."""
    pred = normalize_answer(prediction).split()
    return max(_f1(pred, normalize_answer(r).split()) for r in references)


def _lcs(a: list[str], b: list[str]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l(prediction: str, references: Sequence[str]) -> float:
    """ROUGE-L F1 over whitespace tokens (what LongBench's ``rouge`` package computes)."""
    best = 0.0
    pred = prediction.lower().split()
    for ref in references:
        r = ref.lower().split()
        if not pred or not r:
            continue
        lcs = _lcs(pred, r)
        if lcs == 0:
            continue
        precision, recall = lcs / len(pred), lcs / len(r)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def classification(prediction: str, references: Sequence[str], all_classes: Sequence[str] = ()) -> float:
    """LongBench classification_score (TREC): credit split over the class names mentioned."""
    matches = [c for c in all_classes if c in prediction]
    # A class name that is a substring of the reference does not count against it.
    matches = [m for m in matches if not (m in references[0] and m != references[0])]
    return 1.0 / len(matches) if references[0] in matches else 0.0


def count(prediction: str, references: Sequence[str]) -> float:
    """LongBench count_score (PassageCount): share of numbers in the answer that are right."""
    numbers = re.findall(r"\d+", prediction)
    if not numbers:
        return 0.0
    return sum(n == str(references[0]) for n in numbers) / len(numbers)


def retrieval(prediction: str, references: Sequence[str]) -> float:
    """LongBench retrieval_score (PassageRetrieval-en): "Paragraph N" with the right N."""
    target = re.findall(r"Paragraph (\d+)", references[0])
    numbers = re.findall(r"\d+", prediction)
    if not numbers or not target:
        return 0.0
    return sum(n == target[0] for n in numbers) / len(numbers)


def code_sim(prediction: str, references: Sequence[str]) -> float:
    """LongBench code_sim_score (LCC, RepoBench-P): fuzzy ratio of the first code line."""
    line = ""
    for candidate in prediction.lstrip("\n").split("\n"):
        if "`" not in candidate and "#" not in candidate and "//" not in candidate:
            line = candidate
            break
    return fuzz.ratio(line, references[0]) / 100


# --------------------------------------------------------------------------- LongBench v2, HELMET
def choice_accuracy(prediction: str, references: Sequence[str]) -> float:
    """LongBench v2: the letter in "The correct answer is (X)" equals the reference letter."""
    pred = prediction.replace("*", "")
    found = re.search(r"The correct answer is \(([A-D])\)", pred) or re.search(r"The correct answer is ([A-D])", pred)
    return float(bool(found) and found.group(1) == references[0])


def substring_exact_match(prediction: str, references: Sequence[str]) -> float:
    """HELMET RAG SubEM: a normalised reference occurs in the normalised prediction."""
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(r) in pred for r in references))


def exact_match(prediction: str, references: Sequence[str]) -> float:
    """HELMET ICL: the normalised first line equals a normalised reference label."""
    first = normalize_answer(prediction.strip().split("\n")[0])
    return float(any(first == normalize_answer(r) for r in references))


def _tokens(text: str) -> list[str]:
    return normalize_answer(text).split()


METRICS: dict[str, Callable[..., float]] = {
    "string_match_all": string_match_all,
    "string_match_part": string_match_part,
    "exact_number": exact_number_match,
    "rouge1_recall": rouge1_recall,
    "qa_f1": qa_f1,
    "rouge_l": rouge_l,
    "classification": classification,
    "count": count,
    "retrieval": retrieval,
    "code_sim": code_sim,
    "choice": choice_accuracy,
    "subem": substring_exact_match,
    "exact_match": exact_match,
}


# LongBench scores each ground truth separately and keeps the best; these metrics look at one
# reference at a time.
_PER_REFERENCE = {"classification", "count", "retrieval", "code_sim"}


def score(metric: str, prediction: str, references: Sequence[str], **extra) -> float:
    """Score one prediction with a metric by name."""
    fn = METRICS[metric]
    if metric in _PER_REFERENCE:
        return max(float(fn(prediction, [ref], **extra)) for ref in references)
    return float(fn(prediction, references, **extra))
