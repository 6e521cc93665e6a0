"""The decode loop: stopping rules, sampling, chat encoding."""

from __future__ import annotations

import pytest
import torch

from dapq.decoding import DecodeStepper
from dapq.errors import ConfigError
from dapq.generation import SamplingConfig, generate, generate_many
from dapq.methods import build
from dapq.prompts import encode_prompts

from conftest import TOKENIZER, random_prompt


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


def test_generate_many_equals_one_prefill_per_method(llama, tokenizer):
    """One shared prefill + compress() per method + stacked decoding = each method's own run."""
    prompt = random_prompt(70, seed=3)
    methods = [build("full"), build("dapq", budget=16), build("dapq", budget=16, keep_recent=4, content="random_vocab"),
               build("snapkv", budget=16), build("pyramidkv", budget=16), build("h2o", budget=24),
               build("streamingllm", budget=16), build("lacache", budget=16), build("snapkv", budget=100)]
    many = generate_many(llama, tokenizer, prompt, methods, max_new_tokens=8, max_batch=2)
    outputs = set()
    for method, got in zip(methods, many, strict=True):
        alone = generate(llama, tokenizer, [""], method, prompt_ids=[prompt], max_new_tokens=8)[0]
        assert got.token_ids == alone.token_ids, method.config()
        assert got.kept_tokens_per_head == alone.kept_tokens_per_head
        assert got.kv_bytes_kept == alone.kv_bytes_kept and got.config == alone.config
        outputs.add(tuple(got.token_ids))
    assert len(outputs) > 3  # the methods disagree, so equality above is not trivial


def test_generate_many_stacks_head_wise_rows_with_flat_ones(llama, tokenizer):
    """A head-wise row whose heads happen to keep equal counts (a safeguard of the whole budget) has
    a flat row's slot count, so the sweep decodes them in one batch: the flat row's mask is spread
    over the heads, and each row decodes as alone. That split is the flat one, so its tokens are too."""
    prompt = random_prompt(70, seed=5)
    methods = [build("dapq", budget=16), build("dapq", budget=16, head_budget="adaptive", head_floor=1.0),
               build("snapkv", budget=16, head_budget="adaptive")]
    many = generate_many(llama, tokenizer, prompt, methods, max_new_tokens=8, max_batch=3)
    for method, got in zip(methods, many, strict=True):
        alone = generate(llama, tokenizer, [""], method, prompt_ids=[prompt], max_new_tokens=8)[0]
        assert got.token_ids == alone.token_ids, method.config()
    assert many[1].token_ids == many[0].token_ids


def test_stacked_states_decode_like_each_alone(llama):
    from dapq.compress import PrefillResult, make_batch, prefill

    from helpers import compressed_logits

    prompt = random_prompt(50, seed=4)
    states = [prefill(llama, m, make_batch(llama, m, [prompt], pad_id=0, tokenizer=TOKENIZER))
              for m in (build("dapq", budget=12), build("snapkv", budget=12), build("streamingllm", budget=12))]
    stacked = PrefillResult.stack(states)
    assert stacked.cache.layers[0].keys.shape[0] == 3 and stacked.batch.width == 50
    tokens = [5, 9, 17]
    with DecodeStepper(llama, stacked, len(tokens)) as step:
        together = torch.stack([step(torch.tensor([t] * 3)) for t in tokens], dim=1)
    for row, state in enumerate(states):
        torch.testing.assert_close(together[row], compressed_logits(llama, state, tokens), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="same prompt width"):
        PrefillResult.stack([states[0], prefill(llama, build("full"), make_batch(llama, build("full"), [prompt], pad_id=0, tokenizer=TOKENIZER))])
