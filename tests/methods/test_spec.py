"""Method specs written on the command line: ``name(key=value,...)``, parsed and validated before any model loads."""

from __future__ import annotations

import pytest

from dapq.errors import ConfigError
from dapq.methods.spec import parse_methods, split_top_level


def test_commas_inside_brackets_and_quotes_do_not_split():
    assert split_top_level("full,dapq(token_ids=(1,2,3),n_pseudo=8),snapkv") == [
        "full", "dapq(token_ids=(1,2,3),n_pseudo=8)", "snapkv"]
    assert split_top_level("text='a, b',ids=[1,2]") == ["text='a, b'", "ids=[1,2]"]


def test_a_tuple_parameter_can_be_written():
    specs = parse_methods("full,dapq(content='tokens',token_ids=(1,2,3),n_pseudo=8),snapkv(window=16)")
    assert [s.name for s in specs] == ["full", "dapq", "snapkv"]
    method = specs[1].build(32)
    assert method.token_ids == (1, 2, 3) and method.n_pseudo == 8 and method.content == "tokens"
    assert method.pseudo_tokens([5] * 40, vocab_size=320, model_type="llama")[:3] == [1, 2, 3]
    assert specs[0].label == "full" and specs[2].build(32).window == 16
    assert parse_methods("dapq(text='a, b',content='text')")[0].build(8).text == "a, b"


@pytest.mark.parametrize("spec,needle", [
    ("dapq(token_ids=(1,2.5))", "token_ids must be a list of integers"),
    ("dapq(token_ids=(1,-2))", "non-negative"),
    ("dapq(content='tokens',token_ids=())", "needs token_ids"),
    ("dapq(token_ids=(1,2,3)", "bad parameter"),
])
def test_bad_tuple_parameters_are_refused_before_any_model_loads(spec, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_methods(spec)


def test_token_ids_beyond_the_vocabulary_are_refused_with_the_model():
    method = parse_methods("dapq(content='tokens',token_ids=(1,400))")[0].build(8)
    with pytest.raises(ConfigError, match="below the model's vocabulary of 320"):
        method.pseudo_tokens([5] * 40, vocab_size=320, model_type="llama")
