"""dapq's selections equal NVIDIA kvpress's presses (SnapKVPress, TOVAPress), an independent implementation."""

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
