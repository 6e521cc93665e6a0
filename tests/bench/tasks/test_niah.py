"""NIAH prompts: deterministic, sized with the tokenizer, needle where asked."""

from __future__ import annotations

import pytest

from dapq.bench.tasks.niah import exact_number_match, make_needle_prompt
from dapq.errors import DapqError
from dapq.prompts import encode_prompts


@pytest.mark.parametrize("length", [200, 400])
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_length_depth_and_determinism(tokenizer, length, depth):
    s = make_needle_prompt(tokenizer, length, depth, seed=3)
    n = len(encode_prompts(tokenizer, [s.prompt], chat=True, answer_prefix=s.answer_prefix)[0])
    assert length - 30 <= n <= length  # within one haystack sentence (about 25 tokens here)
    assert s == make_needle_prompt(tokenizer, length, depth, seed=3)
    assert s != make_needle_prompt(tokenizer, length, depth, seed=4)
    body = s.prompt[: s.prompt.index("\nWhat is")]
    assert s.prompt[: s.context_end] == body  # --compress context: the haystack, without the question
    needle = body.index("One of the special magic numbers")
    needle_len = body.index(s.reference, needle) + len(s.reference) + 2 - needle
    # The needle starts where the depth says, within one haystack sentence (about 90 characters).
    assert abs(needle - depth * (len(body) - needle_len)) < 100


def test_too_short_length_is_an_error(tokenizer):
    with pytest.raises(DapqError, match="needs more than"):
        make_needle_prompt(tokenizer, 50, 0.5)


def test_exact_number_match():
    assert exact_number_match(" 4817263.", "4817263") == 1.0
    assert exact_number_match(" 4,817,263", "4817263") == 1.0
    assert exact_number_match(" 11. Also 4817263", "4817263") == 0.0
    assert exact_number_match(" none", "4817263") == 0.0
