"""Each metric against worked examples computed by hand."""

from __future__ import annotations

import pytest

from dapq.bench.metrics import normalize_answer, score


@pytest.mark.parametrize("metric,pred,refs,expected", [
    # RULER: 2 of 3 references appear, case-insensitively.
    ("string_match_all", "The numbers are 123 and ABC.", ["123", "abc", "999"], 2 / 3),
    ("string_match_part", "The numbers are 123.", ["999", "123"], 1.0),
    ("string_match_part", "nothing", ["999", "123"], 0.0),
    # qa F1: pred {paris, france} vs ref {paris}: P = 1/2, R = 1, F1 = 2/3.
    ("qa_f1", "Paris, France.", ["The Paris"], 2 / 3),
    ("qa_f1", "London", ["Paris", "london"], 1.0),
    # ROUGE-L: pred "the cat sat on mat" vs ref "the cat is on the mat": LCS = 4 (the cat on mat),
    # P = 4/5, R = 4/6, F1 = 2PR/(P+R) = 8/11.
    ("rouge_l", "the cat sat on mat", ["the cat is on the mat"], 8 / 11),
    # count: numbers 3, 5, 3 -> two of three are the reference 3.
    ("count", "3 or 5, I think 3", ["3"], 2 / 3),
    # retrieval: "Paragraph 7" among numbers 7 and 12 -> 1/2.
    ("retrieval", "Paragraph 7 or Paragraph 12", ["Paragraph 7"], 0.5),
    ("retrieval", "Paragraph 7", ["Paragraph 7"], 1.0),
    # code similarity: the first line without comments is compared; identical -> 1.
    ("code_sim", "# a comment\nx = foo(1)\ny = 2", ["x = foo(1)"], 1.0),
    ("choice", "The correct answer is (B).", ["B"], 1.0),
    ("choice", "The correct answer is C", ["B"], 0.0),
    ("subem", "It is clover, a legume.", ["Clover"], 1.0),
    ("exact_match", "Location\nmore text", ["location"], 1.0),
    ("exact_match", "location area", ["location"], 0.0),
    ("exact_number", " 4,817,263.", ["4817263"], 1.0),
    # ROUGE-1 recall: 3 of the 4 reference words (after dropping "the").
    ("rouge1_recall", "eat a sandwich in a park", ["eat the sandwich in Dolores"], 3 / 4),
])
def test_worked_examples(metric, pred, refs, expected):
    assert score(metric, pred, refs) == pytest.approx(expected)


def test_classification_splits_credit():
    classes = ["Individual", "Definition of something", "Other location", "location"]
    # Two classes named ("Individual", "location"): half credit for the right one.
    assert score("classification", "Individual or location", ["Individual"], all_classes=classes) == 0.5
    # "location" is a substring of the reference "Other location": it does not count against it.
    assert score("classification", "Other location", ["Other location"], all_classes=classes) == 1.0
    assert score("classification", "Individual", ["Other location"], all_classes=classes) == 0.0


def test_code_sim_partial():
    assert 0.5 < score("code_sim", "x = foo(2)", ["x = foo(1)"]) < 1.0


def test_normalize_answer():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
