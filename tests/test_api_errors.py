"""Bad input to the Python API: a DapqError that names the problem, never a raw error from below."""

from __future__ import annotations

import pytest
import torch

import dapq
from dapq.errors import DapqError

from conftest import TOKENIZER, random_prompt, tiny_model


@pytest.mark.parametrize(("call", "message"), [
    (lambda m: dapq.generate(m, TOKENIZER, [], "full"), "give at least one prompt"),
    (lambda m: dapq.generate(m, TOKENIZER, None, "full", prompt_ids=[[1, 2, 99999]]), "token id 99999 is not in"),
    (lambda m: dapq.generate(m, TOKENIZER, None, "full", prompt_ids=[[1, -5]]), "token id -5 is not in"),
    (lambda m: dapq.generate(m, TOKENIZER, None, "full", prompt_ids=[[]]), "prompt 0 has no tokens"),
    (lambda m: dapq.generate(m, TOKENIZER, None, "full", prompt_ids=["abc"]), "must be a list of integers"),
    (lambda m: dapq.generate_many(m, TOKENIZER, [1, 400], [dapq.build("full")]), "token id 400"),
    (lambda m: dapq.compress_context(m, TOKENIZER, []), "give at least one context"),
    (lambda m: dapq.ask(m, TOKENIZER, "a context as text", ["q"]), "needs the CompressedContext"),
    (lambda m: dapq.generate(m, TOKENIZER, None, dapq.build("deferkv", budget=2, steps=1000),
                             prompt_ids=[random_prompt(5)]), "1000 look-ahead steps"),
    (lambda m: dapq.generate(m, TOKENIZER, None, dapq.build("h2o", budget=8, keep_recent=100000),
                             prompt_ids=[random_prompt(5)]), "keep_recent=100000 exceeds the model's context"),
])
def test_api_bad_input_is_one_named_error(llama, call, message):
    with pytest.raises(DapqError, match=message):
        call(llama)


def test_a_compressed_context_refuses_another_model_or_dtype(llama):
    ctx = dapq.compress_context(llama, TOKENIZER, [], dapq.build("dapq", budget=8), context_ids=[random_prompt(40)])
    assert dapq.ask(llama, TOKENIZER, ctx, [], question_ids=[[5, 6]], max_new_tokens=2)  # its own model answers
    for other, what in ((tiny_model("llama", seed=3), "checksum"), (tiny_model("llama").to(torch.bfloat16), "dtype"),
                        (tiny_model("qwen3"), "model_type")):
        with pytest.raises(DapqError, match=f"compressed by another model.*{what}"):
            dapq.ask(other, TOKENIZER, ctx, [], question_ids=[[5, 6]], max_new_tokens=2)


def test_prompts_shorter_than_the_recent_tokens_keep_everything(llama):
    """A 5-token prompt under keep_recent=8 (DeferKV's default) or keep_recent=200 used to crash."""
    for method in (dapq.build("deferkv", budget=2, steps=3), dapq.build("dapq", budget=8, keep_recent=200),
                   dapq.build("snapkv", budget=4, window=16, layer_budget="pyramid")):
        out = dapq.generate(llama, TOKENIZER, None, method, prompt_ids=[random_prompt(5)], max_new_tokens=2)
        assert len(out[0].token_ids) == 2
