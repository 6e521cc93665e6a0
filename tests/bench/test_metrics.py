"""Each metric against hand-made cases, pinned where only the official definition gives the value.

Where the official scorer calls a library (``rouge`` for LongBench, ``rouge_score`` for HELMET,
``difflib`` under LongBench's fuzzywuzzy), the case is also checked against that library.
Literal values were computed with those libraries and by hand (in the comments).
"""

from __future__ import annotations

import difflib

import pytest

from dapq.bench import metrics
from dapq.bench.metrics import (
    METRICS,
    code_sim,
    fuzz_ratio,
    helmet_f1,
    helmet_parse_output,
    normalize_answer,
    qa_f1,
    rougeL_f1,
    score,
)


@pytest.mark.parametrize("metric,pred,refs,expected", [
    # RULER: 2 of 3 references appear, case-insensitively.
    ("string_match_all", "The numbers are 123 and ABC.", ["123", "abc", "999"], 2 / 3),
    ("string_match_part", "The numbers are 123.", ["999", "123"], 1.0),
    ("string_match_part", "nothing", ["999", "123"], 0.0),
    # qa F1: pred {paris, france} vs ref {paris}: P = 1/2, R = 1, F1 = 2/3.
    ("qa_f1", "Paris, France.", ["The Paris"], 2 / 3),
    ("qa_f1", "London", ["Paris", "london"], 1.0),  # the best ground truth counts
    # count: numbers 3, 5, 3 -> two of three are the reference 3.
    ("count", "3 or 5, I think 3", ["3"], 2 / 3),
    # retrieval: "Paragraph 7" among numbers 7 and 12 -> 1/2.
    ("retrieval", "Paragraph 7 or Paragraph 12", ["Paragraph 7"], 0.5),
    ("retrieval", "Paragraph 7", ["Paragraph 7"], 1.0),
    # code similarity: the first line without comments is compared; identical -> 1.
    ("code_sim", "# a comment\nx = foo(1)\ny = 2", ["x = foo(1)"], 1.0),
    ("choice", "The correct answer is (B).", ["B"], 1.0),
    ("choice", "**The correct answer is C**", ["C"], 1.0),  # asterisks removed, brackets optional
    ("choice", "The correct answer is C", ["B"], 0.0),
    ("exact_number", " 4,817,263.", ["4817263"], 1.0),
    # ROUGE-1 recall: 3 of the 4 reference words (after dropping "the").
    ("rouge1_recall", "eat a sandwich in a park", ["eat the sandwich in Dolores"], 3 / 4),
    # HELMET: normalized equality, normalized substring.
    ("exact_match", "The Paris!", ["paris"], 1.0),
    ("exact_match", "Paris, France", ["paris"], 0.0),
    ("substring_exact_match", "It is clover, a legume.", ["Clover"], 1.0),
    ("substring_exact_match", "It is a legume.", ["Clover", "oak"], 0.0),
])
def test_worked_examples(metric, pred, refs, expected):
    assert score(metric, pred, refs) == pytest.approx(expected)


def test_metrics_are_registered_by_name():
    for name in ("qa_f1", "rouge_l", "classification", "count", "retrieval", "code_sim", "choice", "exact_match",
                 "substring_exact_match", "f1", "rougeL_f1"):
        assert callable(METRICS[name])


def test_digit_prefix_share_counts_the_needle_digits_from_the_first():
    from dapq.bench.metrics import digit_prefix_share

    assert digit_prefix_share(" 4336.", ["4336396"]) == pytest.approx(4 / 7)
    assert digit_prefix_share(" 1,334,851.", ["1334851"]) == 1.0
    assert digit_prefix_share(" 339208.", ["3369208"]) == pytest.approx(2 / 7)  # stops at the first wrong digit
    assert digit_prefix_share(" 5334851", ["1334851"]) == 0.0


# --------------------------------------------------------------------------- LongBench ROUGE-L
@pytest.mark.parametrize("pred,ref,expected,whitespace_lcs", [
    # The `rouge` package keeps case and counts distinct words, sentence by sentence (split on
    # "."): hyp sentences "The cat sat" / "On the mat", ref words {the, cat, sat, on, mat} (5),
    # hyp words {The, cat, sat, On, the, mat} (6); union LCS {cat, sat, the, mat} = 4:
    # R = 4/5, P = 4/6, F = 2PR/(P+R+1e-8) = 0.72727... A lower-cased LCS over whitespace
    # tokens gives 2/3.
    ("The cat sat. On the mat.", "the cat sat on the mat", 0.7272727223140496, 2 / 3),
    # "c." and "c" are the same word once "." splits sentences: F = 1 - 1e-8 rounding, not 0.8.
    ("a b c. d e", "a b c d e", 0.999999995, 0.8),
])
def test_rouge_l_is_the_rouge_package(pred, ref, expected, whitespace_lcs):
    from rouge import Rouge

    assert score("rouge_l", pred, [ref]) == pytest.approx(expected, abs=1e-12)
    assert score("rouge_l", pred, [ref]) == Rouge().get_scores([pred], [ref], avg=True)["rouge-l"]["f"]
    assert abs(expected - whitespace_lcs) > 0.05  # what a hand-written LCS F1 would have given


def test_rouge_l_scores_errors_zero_and_takes_the_best_reference():
    assert score("rouge_l", "", ["a summary"]) == 0.0  # the package raises on an empty hypothesis
    assert score("rouge_l", "a b c. d e", ["x y", "a b c d e"]) == pytest.approx(0.999999995)


# --------------------------------------------------------------------------- LongBench code_sim
def test_code_sim_is_fuzzywuzzy_ratio_without_levenshtein():
    # difflib's matching blocks are not an LCS: "barb" vs "ab" matches one character (the
    # longest block "b", then nothing on either side): round(100 * 2/6) = 33. An InDel/LCS
    # ratio (python-Levenshtein, rapidfuzz) gives 2 * 2/6 = 66.7.
    assert code_sim("barb", ["ab"]) == 0.33
    assert fuzz_ratio("barb", "ab") == round(100 * difflib.SequenceMatcher(None, "barb", "ab").ratio())
    # int(round(x)) rounds halves to even: 2 * 5/16 = 62.5 -> 62 (round-half-up would give 63).
    assert 100 * difflib.SequenceMatcher(None, "cbayyzyc", "ccazyxyz").ratio() == 62.5
    assert code_sim("cbayyzyc", ["ccazyxyz"]) == 0.62
    # difflib's autojunk: in a line of 200+ characters, characters that make up over 1% of it
    # are junk, so this near-copy scores 0 (rapidfuzz: 99).
    line = "ab" * 110
    assert code_sim("x = " + line, [line]) == 0.0
    # fuzzywuzzy's decorators: equal strings 100 before anything else, an empty side 0.
    assert fuzz_ratio("", "") == 100 and fuzz_ratio("", "x") == 0


def test_code_sim_first_code_line():
    assert code_sim("\n\n```python\n# note\n// js\nx = 1\ny = 2", ["x = 1"]) == 1.0
    assert code_sim("# only comments", ["x = 1"]) == 0.0  # no code line: "" vs the reference


# --------------------------------------------------------------------------- LongBench classification
def test_classification_splits_credit():
    classes = ["Individual", "Definition of something", "Other location", "location"]
    # Two classes named ("Individual", "location"): half credit for the right one.
    assert score("classification", "Individual or location", ["Individual"], all_classes=classes) == 0.5
    # "location" is a substring of the reference "Other location": it does not count against it.
    assert score("classification", "Other location", ["Other location"], all_classes=classes) == 1.0
    assert score("classification", "Individual", ["Other location"], all_classes=classes) == 0.0


def test_classification_keeps_the_official_loop_quirk():
    # metrics.py removes items from the list it iterates over: after "location" goes, "Other"
    # moves into its slot and is skipped, so it stays and halves the credit. Removing every
    # substring of the reference would give 1.0.
    classes = ["location", "Other", "Other location"]
    assert score("classification", "Other location", ["Other location"], all_classes=classes) == 0.5


def test_longbench_scores_each_ground_truth_and_keeps_the_best():
    assert score("count", "3", ["2", "3"]) == 1.0
    assert score("retrieval", "Paragraph 4", ["Paragraph 1", "Paragraph 4"]) == 1.0
    assert score("code_sim", "x = 1", ["y = 2", "x = 1"]) == 1.0


# --------------------------------------------------------------------------- HELMET
def test_helmet_rouge_l_stems_like_rouge_score():
    from rouge_score import rouge_scorer

    # With the Porter stemmer "cats"/"cat" and "running"/"runs" meet: LCS 2 of 4 and 2 tokens,
    # P = 1/2, R = 1, F = 2/3; without stemming nothing matches.
    assert rougeL_f1("the cats were running", ["cat runs"]) == pytest.approx(2 / 3)
    plain = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False).score("cat runs", "the cats were running")
    assert plain["rougeL"].fmeasure == 0.0
    stemmed = rouge_scorer.RougeScorer(["rougeL", "rougeLsum"], use_stemmer=True)  # what HELMET builds
    for pred, ref in [("the cats were running", "cat runs"), ("Ships sailed north.", "the ship sails north")]:
        assert rougeL_f1(pred, [ref]) == stemmed.score(target=ref, prediction=pred)["rougeL"].fmeasure
    assert rougeL_f1("the cats were running", ["dogs", "cat runs"]) == pytest.approx(2 / 3)  # best reference


def test_helmet_rouge_l_needs_no_nltk_download(monkeypatch):
    import nltk

    def no_download(*args, **kwargs):
        raise AssertionError("nltk tried to download data")

    monkeypatch.setattr(nltk, "download", no_download)
    metrics._rouge_scorer.cache_clear()
    assert rougeL_f1("running", ["runs"]) == 1.0


def test_helmet_f1_yes_no_rule():
    # HELMET's f1_score: 0 whenever a side is yes/no/noanswer and the sides differ, although
    # "yes" and "yes it is" share a token (LongBench's qa_f1 gives 2 * 1 * 1/3 / (4/3) = 0.5).
    assert helmet_f1("yes", ["yes it is"]) == 0.0 and qa_f1("yes", ["yes it is"]) == 0.5
    assert helmet_f1("no way", ["no"]) == 0.0
    assert helmet_f1("Yes.", ["yes"]) == 1.0
    assert helmet_f1("Paris, France", ["London", "Paris"]) == pytest.approx(2 / 3)


@pytest.mark.parametrize("output,prefix,parsed", [
    ("Answer: Paris\nBerlin", "Answer:", "Paris"),  # after the prefix, up to the line end
    ("I think. answer: Paris", "Answer:", "Paris"),  # anywhere, any case
    ("Paris is big\nANSWER:", "Answer:", ""),  # the prefix wins over the first line, even at the end
    ("Rome\nFlorence", "Answer:", "Rome"),  # no prefix: the first line
    ("Answer: Answer: Oslo", "Answer:", "Oslo"),  # a repeated prefix is stripped once more
    ("label: 3\nlabel: 4", "label:", "3"),
])
def test_helmet_parse_output(output, prefix, parsed):
    assert helmet_parse_output(output, prefix) == parsed


def test_helmet_post_processing():
    # RAG (no chat template): "Answer:" is put in front; the better of raw and parsed output counts.
    rag = {"system_template": "Answer:", "prepend": True}
    assert score("substring_exact_match", " I think\nParis", ["Paris"], helmet=rag) == 1.0  # raw text has it
    assert score("exact_match", " Paris\nmore text", ["Paris"], helmet=rag) == 1.0  # parsed "Paris"
    assert score("exact_match", " Paris\nmore text", ["Paris"]) == 0.0  # without post-processing
    # ICL: only the parsed label counts.
    icl = {"system_template": "label:", "prepend": True, "parsed_only": True}
    assert score("exact_match", " 3\nlabel: 4", ["3"], helmet=icl) == 1.0
    assert score("exact_match", " 3\nlabel: 4", ["4"], helmet=icl) == 0.0
    assert score("substring_exact_match", " 3\nlabel: 4", ["4"], helmet=icl) == 0.0
    # LongQA (chat template): nothing put in front; parse the first line or after "Answer:".
    chat = {"system_template": "Answer:"}
    assert score("rougeL_f1", "Answer: a brass bell\nThe keeper kept it.", ["a brass bell"], helmet=chat) == 1.0


def test_normalize_answer():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
