"""dapq.compat: each transformers difference is answered the same way on every release.

These run on whichever transformers the environment holds; CI runs them on 5.2.0, 5.17.0 and
5.25.0. Where transformers itself behaves differently (``crop``), a test says how.
"""

from __future__ import annotations

import copy
import inspect
import warnings

import pytest
import torch
import transformers
from packaging.version import Version
from transformers import DynamicCache

from dapq import compat
from dapq.compress import make_batch, prefill
from dapq.methods import build
from dapq.models import AttentionHooks

from conftest import random_prompt


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.tensor([random_prompt(n, seed)])


def test_forward_passes_the_cache_under_the_declared_keyword(llama):
    ids = _ids(12)
    positions = torch.arange(12)[None]
    cache = DynamicCache()
    with warnings.catch_warnings():
        # 5.24+ renamed the keyword and warns on the old one: compat must pass the new one there.
        warnings.simplefilter("error", FutureWarning)
        out = compat.forward(llama, ids[:, :8], position_ids=positions[:, :8], cache=cache, first_column=0)
        step = compat.forward(llama, ids[:, 8:], position_ids=positions[:, 8:], cache=cache, first_column=8,
                              attention_mask=torch.ones(1, 12, dtype=torch.long))
    assert cache.get_seq_length() == 12  # the cache really was the one the model used
    with torch.no_grad():
        plain = llama(input_ids=ids, position_ids=positions).logits
    torch.testing.assert_close(out.logits, plain[:, :8], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step.logits, plain[:, 8:], rtol=1e-5, atol=1e-5)


def test_hooks_find_the_cache_each_attention_layer_received(llama):
    seen = []

    class Spy(AttentionHooks):
        def _hook(self, module, args, kwargs, output):
            seen.append(compat.layer_cache(module, kwargs))

    cache = DynamicCache()
    with Spy(llama):
        compat.forward(llama, _ids(6), position_ids=torch.arange(6)[None], cache=cache, first_column=0)
    assert len(seen) == llama.config.num_hidden_layers and all(c is cache for c in seen)


def test_truncate_keeps_a_prefix_where_crop_changed_meaning(llama):
    cache = DynamicCache()
    compat.forward(llama, _ids(10), position_ids=torch.arange(10)[None], cache=cache, first_column=0)
    layer = cache.layers[0]
    keys = layer.keys.clone()
    # What transformers' own crop does with the same call differs by release (the compat table):
    # up to 5.14 crop(n) keeps n tokens, so crop(0) empties the layer; from 5.15 its argument is
    # the number to remove, so crop(0) is a no-op; from 5.20 a positive n raises.
    probe = copy.copy(layer)  # crop rebinds probe's tensors; the layer keeps its own
    probe.crop(0)
    version = Version(transformers.__version__)
    assert probe.keys.shape[2] == (0 if version < Version("5.15") else 10)
    if version >= Version("5.20"):
        with pytest.raises(ValueError):
            copy.copy(layer).crop(4)
    compat.truncate(layer, 4)
    torch.testing.assert_close(layer.keys, keys[:, :, :4])
    compat.truncate_cache(cache, 0)
    assert all(layer.keys.shape[2] == 0 and layer.values.shape[2] == 0 for layer in cache.layers)


def test_compressed_cache_reports_logical_length_and_physical_slots(llama, tokenizer):
    prompts = [random_prompt(40, 1), random_prompt(30, 2)]
    method = build("snapkv", budget=8)
    state = prefill(llama, method, make_batch(llama, method, prompts, pad_id=0, tokenizer=tokenizer))
    cache = state.cache
    for layer_idx in range(llama.config.num_hidden_layers):
        # Positions and the mask's query offset: the padded prompt width, evicted tokens included.
        assert cache.get_seq_length(layer_idx) == cache.get_query_offset(layer_idx) == 40
        # The mask's key axis: this layer's physical slots plus the query, read from logical offset.
        first = list(inspect.signature(DynamicCache.get_mask_sizes).parameters)[1]
        query = torch.arange(40, 43) if first == "cache_position" else 3  # 5.2-5.3 vs 5.4+
        assert cache.get_mask_sizes(query, layer_idx) == (8 + 3, 40 - 8)


def test_attention_implementations_are_loadable():
    for impl in compat.attention_implementations()[:2]:
        from conftest import tiny_model

        assert tiny_model("llama", attn=impl).config._attn_implementation == impl


def test_tokenizer_round_trip_detects_a_missing_decoder(tokenizer):
    from transformers import PreTrainedTokenizerFast

    assert compat.tokenizer_round_trips(tokenizer)
    broken = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer.__class__.from_str(
        tokenizer.backend_tokenizer.to_str()))
    broken.backend_tokenizer.decoder = None  # what 5.17+ made of 5.2's saved GGUF tokenizer
    assert not compat.tokenizer_round_trips(broken)
