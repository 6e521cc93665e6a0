"""Scoring functions of the benchmarks, each as its benchmark's official code defines it.

Every function takes a prediction and a list of references and returns a float in [0, 1].
Where an official scorer calls a library, the function calls the same library; hand-written
code is left only where the official scorer is hand-written too, and there it keeps the
official behaviour, quirks included (each quirk is named in a comment).

- LongBench (THUDM/LongBench ``LongBench/metrics.py`` and ``eval.py``): ``qa_f1``, ``rouge_l``
  (the ``rouge`` package), ``classification``, ``count``, ``retrieval``, ``code_sim``
  (fuzzywuzzy's ``fuzz.ratio`` as LongBench's requirements install it: difflib underneath).
  Each scores one ground truth; :func:`score` keeps the best over the ground truths.
- LongBench v2 (``pred.py``): ``choice``.
- HELMET (princeton-nlp/HELMET ``utils.py``: ``calculate_metrics``, ``parse_output``; ``data.py``
  and ``eval.py`` for the post-processing): ``exact_match``, ``f1``, ``substring_exact_match``,
  ``rougeL_f1`` (the ``rouge_score`` package with stemming). :func:`score` applies HELMET's
  output post-processing when ``metric_args`` carry ``helmet={...}``.
"""

from __future__ import annotations

import difflib
import functools
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence


# --------------------------------------------------------------------------- RULER, NIAH
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


def digit_prefix_share(prediction: str, references: Sequence[str]) -> float:
    """NIAH partial credit: the share of the needle's digits the answer reproduces from the first one on.

    Not a benchmark's metric: a tie-breaker for the result tables when exact match is 0 almost
    everywhere (a method that keeps part of the needle recovers its first digits: 4336 of
    4336396 scores 4/7).
    """
    digits = "".join(ch for ch in prediction if ch.isdigit())
    reference = references[0]
    n = 0
    while n < min(len(digits), len(reference)) and digits[n] == reference[n]:
        n += 1
    return n / len(reference)


def rouge1_recall(prediction: str, references: Sequence[str]) -> float:
    """Unigram recall of the reference sentence (the sentence-needle NIAH metric)."""
    ref = normalize_answer(references[0]).split()
    pred = Counter(normalize_answer(prediction).split())
    if not ref:
        return 0.0
    overlap = sum(min(c, pred[w]) for w, c in Counter(ref).items())
    return overlap / len(ref)


# --------------------------------------------------------------------------- LongBench
def normalize_answer(s: str) -> str:
    """SQuAD normalization (LongBench's and HELMET's): lower case, no punctuation, articles, extra spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _token_f1(pred_tokens: list[str], ref_tokens: list[str]) -> float:
    common = Counter(pred_tokens) & Counter(ref_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def qa_f1(prediction: str, references: Sequence[str]) -> float:
    """LongBench ``qa_f1_score``: token F1 of the normalized texts (hand-written there too)."""
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(references[0]).split())


def rouge_l(prediction: str, references: Sequence[str]) -> float:
    """LongBench ``rouge_score``: the ``rouge`` package's summary-level ROUGE-L F.

    That package splits sentences on ".", splits words on single spaces, keeps case, counts
    distinct words, and raises on an empty hypothesis; the official scorer turns any exception
    into 0, and so does this.
    """
    from rouge import Rouge

    try:
        return float(Rouge().get_scores([prediction], [references[0]], avg=True)["rouge-l"]["f"])
    except Exception:  # metrics.py: a bare `except: return 0.0` (empty prediction, recursion depth)
        return 0.0


def classification(prediction: str, references: Sequence[str], all_classes: Sequence[str] = ()) -> float:
    """LongBench ``classification_score`` (TREC): credit split over the class names mentioned.

    Class names that are substrings of the reference are dropped from the matches, with the
    official loop's quirk kept: it removes items from the list it is iterating over, so the
    item right after a removed one is never checked (and stays).
    """
    reference = references[0]
    matches = [c for c in all_classes if c in prediction]
    i = 0
    while i < len(matches):  # a list iterator's walk, written out: removal shifts the next item into slot i
        term = matches[i]
        if term in reference and term != reference:
            matches.remove(term)
        i += 1
    return 1.0 / len(matches) if reference in matches else 0.0


def count(prediction: str, references: Sequence[str]) -> float:
    """LongBench ``count_score`` (PassageCount): share of the numbers in the answer that are right."""
    numbers = re.findall(r"\d+", prediction)
    if not numbers:
        return 0.0
    return sum(n == str(references[0]) for n in numbers) / len(numbers)


def retrieval(prediction: str, references: Sequence[str]) -> float:
    """LongBench ``retrieval_score`` (PassageRetrieval-en): share of the numbers that are the right N.

    The official function fails on a reference without "Paragraph N"; this returns 0 there.
    """
    target = re.findall(r"Paragraph (\d+)", references[0])
    numbers = re.findall(r"\d+", prediction)
    if not numbers or not target:
        return 0.0
    return sum(n == target[0] for n in numbers) / len(numbers)


def fuzz_ratio(a: str, b: str) -> int:
    """fuzzywuzzy 0.18 ``fuzz.ratio`` as LongBench's requirements install it (no python-Levenshtein).

    Without python-Levenshtein, fuzzywuzzy falls back to ``difflib.SequenceMatcher`` (whose
    matching blocks are not a longest common subsequence, and whose autojunk heuristic drops
    frequent characters from strings of 200+ characters), scales by 100 and rounds with
    ``int(round(x))``: to the nearest integer, halves to even (62.5 -> 62). Equal strings score
    100 and an empty one 0 before any matching, as fuzzywuzzy's decorators do.
    """
    if a == b:
        return 100
    if not a or not b:
        return 0
    return int(round(100 * difflib.SequenceMatcher(None, a, b).ratio()))


def code_sim(prediction: str, references: Sequence[str]) -> float:
    """LongBench ``code_sim_score`` (LCC, RepoBench-P): ``fuzz.ratio / 100`` of the first code line.

    The first line (after leading newlines) without a backtick, "#" or "//" is compared.
    """
    line = ""
    for candidate in prediction.lstrip("\n").split("\n"):
        if "`" not in candidate and "#" not in candidate and "//" not in candidate:
            line = candidate
            break
    return fuzz_ratio(line, references[0]) / 100


# --------------------------------------------------------------------------- LongBench v2
def choice_accuracy(prediction: str, references: Sequence[str]) -> float:
    """LongBench v2 ``extract_answer``: the letter in "The correct answer is (X)" is the reference.

    Asterisks are removed first; "The correct answer is X" without brackets is the fallback.
    """
    pred = prediction.replace("*", "")
    found = re.search(r"The correct answer is \(([A-D])\)", pred) or re.search(r"The correct answer is ([A-D])", pred)
    return float(bool(found) and found.group(1) == references[0])


# --------------------------------------------------------------------------- HELMET
def exact_match(prediction: str, references: Sequence[str]) -> float:
    """HELMET ``exact_match``: the normalized prediction equals a normalized reference."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(r) for r in references))


def substring_exact_match(prediction: str, references: Sequence[str]) -> float:
    """HELMET ``substring_exact_match``: a normalized reference occurs in the normalized prediction."""
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(r) in pred for r in references))


def helmet_f1(prediction: str, references: Sequence[str]) -> float:
    """HELMET ``f1``: token F1, best over references, 0 on a yes/no/noanswer mismatch.

    HELMET's ``f1_score`` scores 0 whenever either normalized side is "yes", "no" or
    "noanswer" and the two sides differ, even if they share tokens.
    """
    pred = normalize_answer(prediction)
    best = 0.0
    for ref in references:
        gold = normalize_answer(ref)
        if (pred in ("yes", "no", "noanswer") or gold in ("yes", "no", "noanswer")) and pred != gold:
            continue
        best = max(best, _token_f1(pred.split(), gold.split()))
    return best


@functools.cache
def _rouge_scorer():
    # Imported on first use: rouge_score pulls in nltk (its Porter stemmer needs no data files).
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rougeL_f1(prediction: str, references: Sequence[str]) -> float:
    """HELMET ``rougeL_f1``: ``rouge_score`` ROUGE-L F-measure with Porter stemming, best over references."""
    scorer = _rouge_scorer()
    return max(scorer.score(target=r, prediction=prediction)["rougeL"].fmeasure for r in references)


def helmet_parse_output(output: str, prefix: str = "Answer:") -> str | None:
    """HELMET ``parse_output``: the text after ``prefix`` up to the line end, else the first line.

    The prefix is searched case-insensitively anywhere and used as a regex unescaped, as
    HELMET does; a repeated prefix at the start of the answer is stripped once more.
    """
    found = re.search(f"(?:{prefix})(.*)(?:\n|$)", output, flags=re.IGNORECASE)
    found = found or re.search(r"(?:^)(.*)(?:\n|$)", output)
    if found is None:
        return None
    return re.sub(f"^{re.escape(prefix)}", "", found.group(1).strip(), flags=re.IGNORECASE).strip()


def helmet_post_process(
    fn: Callable[..., float], output: str, references: Sequence[str], *, system_template: str = "Answer:",
    prepend: bool = False, parsed_only: bool = False,
) -> float:
    """HELMET's scoring of one output (``eval.py`` + the task's ``post_process`` in ``data.py``).

    Parameters
    ----------
    fn
        One of the HELMET metric functions.
    system_template
        The task's system template ("Answer:", "label:"): the parse prefix.
    prepend
        Without the chat template HELMET completes the prompt's "Answer:", so it puts the
        system template in front of the output before parsing.
    parsed_only
        ICL scores the parsed label only; the other tasks take the better of the raw and the
        parsed output (``default_post_process``).
    """
    if prepend:
        output = system_template + output
    parsed = helmet_parse_output(output, system_template)
    if parsed_only:
        return float(fn(parsed, references))
    best = float(fn(output, references))
    return best if parsed is None else max(best, float(fn(parsed, references)))


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
    "exact_match": exact_match,
    "substring_exact_match": substring_exact_match,
    "f1": helmet_f1,
    "rougeL_f1": rougeL_f1,
}

# LongBench's eval.py scores each ground truth on its own and keeps the best (starting from 0).
PER_REFERENCE = {"qa_f1", "rouge_l", "classification", "count", "retrieval", "code_sim"}


def score(metric: str, prediction: str, references: Sequence[str], *, helmet: dict | None = None, **extra) -> float:
    """Score one prediction with a metric by name.

    ``helmet`` (HELMET tasks) holds :func:`helmet_post_process`'s keyword arguments; other
    ``extra`` arguments go to the metric (``all_classes`` for LongBench's TREC).
    """
    fn = METRICS[metric]
    if helmet is not None:
        return helmet_post_process(fn, prediction, references, **helmet)
    if metric in PER_REFERENCE:
        return max([0.0] + [float(fn(prediction, [ref], **extra)) for ref in references])
    return float(fn(prediction, references, **extra))
