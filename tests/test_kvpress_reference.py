"""SnapKV's selection equals NVIDIA kvpress's SnapKVPress, an independent implementation."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from dapq.compress import make_batch, prefill
from dapq.methods import build

from conftest import random_prompt, tiny_model
from helpers import import_kvpress

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
        their_keys = theirs.layers[layer_idx].keys[0]  # (Hkv, n_kept, d), in topk order
        all_keys = full.layers[layer_idx].keys[0]  # (Hkv, Lp, d)
        for head in range(their_keys.shape[0]):
            # Map each key kvpress kept back to its prompt column by exact match.
            dist = (their_keys[head][:, None] - all_keys[head][None]).abs().amax(dim=-1)
            assert torch.all(dist.min(dim=1).values < 1e-5)
            their_cols = sorted(dist.argmin(dim=1).tolist())
            assert their_cols == layout.kept_indices[0, head].tolist(), f"layer {layer_idx} head {head}"
