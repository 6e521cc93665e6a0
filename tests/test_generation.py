"""The decode loop: stopping rules, sampling, chat encoding."""

from __future__ import annotations

import pytest

from dapq.errors import ConfigError
from dapq.generation import SamplingConfig, encode_prompts, generate


def test_chat_encoding_adds_template_and_prefix(tokenizer):
    plain = encode_prompts(tokenizer, ["Paris"])[0]
    chat = encode_prompts(tokenizer, ["Paris"], chat=True, answer_prefix=" The")[0]
    text = tokenizer.decode(chat)
    assert text.startswith("<|user|>Paris") and text.endswith("<|assistant|> The")
    assert len(chat) > len(plain)


def test_sampling_is_seeded_and_differs_from_greedy(llama, tokenizer):
    llama.generation_config.eos_token_id = None
    kw = dict(max_new_tokens=12, do_sample=True, temperature=1.5)
    a = generate(llama, tokenizer, ["The grass is"], "full", seed=1, **kw)[0].token_ids
    b = generate(llama, tokenizer, ["The grass is"], "full", seed=1, **kw)[0].token_ids
    c = generate(llama, tokenizer, ["The grass is"], "full", seed=2, **kw)[0].token_ids
    greedy = generate(llama, tokenizer, ["The grass is"], "full", max_new_tokens=12)[0].token_ids
    assert a == b and (a != c or a != greedy)


def test_stop_on_eos_and_stop_strings(llama, tokenizer):
    greedy = generate(llama, tokenizer, ["The sky"], "full", max_new_tokens=10)[0]
    # Make the 3rd greedy token the EOS: generation must end right there.
    llama.generation_config.eos_token_id = greedy.token_ids[2]
    try:
        r = generate(llama, tokenizer, ["The sky"], "full", max_new_tokens=10)[0]
    finally:
        llama.generation_config.eos_token_id = None
    assert r.token_ids == greedy.token_ids[:3] and r.finish_reason == "eos"
    stop = tokenizer.decode(greedy.token_ids[3:5])
    if stop.strip():
        s = generate(llama, tokenizer, ["The sky"], "full", max_new_tokens=10, stop=(stop,))[0]
        assert s.finish_reason == "stop" and stop not in s.text and len(s.token_ids) <= 5


@pytest.mark.parametrize("bad", [dict(max_new_tokens=0), dict(temperature=0.0), dict(top_p=0.0)])
def test_bad_sampling_config(bad):
    with pytest.raises(ConfigError):
        SamplingConfig(**bad)
