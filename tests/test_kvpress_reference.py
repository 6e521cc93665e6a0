"""dapq's selections equal NVIDIA kvpress's presses (SnapKVPress, TOVAPress, AdaKVPress), an independent implementation."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from dapq.compress import make_batch, prefill
from dapq.methods import build

from conftest import random_prompt, tiny_model
from helpers import import_kvpress, kept_columns

kvpress = import_kvpress()


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("lp,ratio,window,kernel", [(96, 0.5, 8, 5), (128, 0.75, 16, 7), (80, 0.3, 4, 3)])
def test_snapkv_selection_matches_kvpress(kind, lp, ratio, window, kernel):
    model = tiny_model(kind, seed=3)
    prompt = random_prompt(lp, seed=lp)
    ids = torch.tensor([prompt])

    press = kvpress.SnapKVPress(compression_ratio=ratio, window_size=window, kernel_size=kernel)
    theirs = DynamicCache()
    with torch.no_grad(), press(model):
        model(input_ids=ids, past_key_values=theirs, use_cache=True)

    # kvpress: mean over window queries, avg-pool, mean over the GQA group, keep int(Lp*(1-r)).
    n_kept = max(1, int(lp * (1 - ratio)))
    ours = build("snapkv", budget=n_kept, window=window, kernel=kernel, pooling="avg", query_reduce="mean")
    state = prefill(model, ours, make_batch(model, ours, [prompt], pad_id=0))

    full = DynamicCache()
    with torch.no_grad():
        model(input_ids=ids, past_key_values=full, use_cache=True)
    for layer_idx, layout in enumerate(state.cache.layers):
        assert kept_columns(theirs, full, layer_idx) == layout.kept_indices[0].tolist(), f"layer {layer_idx}"


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("lp,ratio", [(96, 0.5), (130, 0.8)])
def test_tova_selection_matches_kvpress(kind, lp, ratio):
    """TOVA against kvpress's TOVAPress: the same tokens, in every layer and head."""
    model = tiny_model(kind, seed=4)
    prompt = random_prompt(lp, seed=lp + 1)
    ids = torch.tensor([prompt])
    theirs = DynamicCache()
    with torch.no_grad(), kvpress.TOVAPress(compression_ratio=ratio)(model):
        model(input_ids=ids, past_key_values=theirs, use_cache=True)
    full = DynamicCache()
    with torch.no_grad():
        model(input_ids=ids, past_key_values=full, use_cache=True)
    ours = build("tova", budget=int(lp * (1 - ratio)))
    state = prefill(model, ours, make_batch(model, ours, [prompt], pad_id=0))
    for layer_idx, layout in enumerate(state.cache.layers):
        assert kept_columns(theirs, full, layer_idx) == layout.kept_indices[0].tolist(), f"layer {layer_idx}"


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("lp,ratio,window,alpha", [(96, 0.5, 8, 0.2), (120, 0.75, 4, 0.5), (100, 0.6, 4, 0.0)])
def test_head_budgets_match_kvpress_adakv(kind, lp, ratio, window, alpha):
    """Ada-KV's split of SnapKV's scores against kvpress's AdaKVPress: the same (head, token) pairs
    kept in every layer. kvpress keeps the cache whole and masks the pairs it drops, so its choice
    is read from the indices it masks (``masked_key_indices``)."""
    model = tiny_model(kind, seed=5)
    prompt = random_prompt(lp, seed=lp + 2)
    press = kvpress.AdaKVPress(kvpress.SnapKVPress(compression_ratio=ratio, window_size=window, kernel_size=5),
                               alpha_safeguard=alpha)
    with torch.no_grad(), press(model):
        model(input_ids=torch.tensor([prompt]), past_key_values=DynamicCache(), use_cache=True)
    # Read now: kvpress's attention patch clears them at the model's next forward.
    masked = [layer.self_attn.masked_key_indices for layer in model.model.layers]
    n_kept = max(1, int(lp * (1 - ratio)))
    ours = build("snapkv", budget=n_kept, window=window, kernel=5, pooling="avg", query_reduce="mean",
                 head_budget="adaptive", head_floor=alpha)
    state = prefill(model, ours, make_batch(model, ours, [prompt], pad_id=0))
    uneven = False
    for layer_idx, layout in enumerate(state.cache.layers):
        _, heads, cols = masked[layer_idx]
        n_kv = layout.keys.shape[1]
        theirs = [sorted(set(range(lp)) - set(cols[heads == h].tolist())) for h in range(n_kv)]
        mine = [layout.kept_indices[0, h, int(layout.pad_slots[0, h]):].sort().values.tolist() for h in range(n_kv)]
        assert mine == theirs, f"layer {layer_idx}"
        uneven |= len({len(m) for m in mine}) > 1
    assert uneven  # the heads kept different counts, so the split itself was compared
