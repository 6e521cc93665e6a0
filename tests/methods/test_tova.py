"""TOVA keeps what an independent eager-attention reference keeps, and differs from SnapKV only where it should."""

from __future__ import annotations

import pytest
import torch

from dapq.errors import ConfigError
from dapq.methods import build

from conftest import random_prompt, tiny_model
from helpers import kept_indices


def _reference(kind: str, prompt: list[int], n_kept: int) -> list[list[int]]:
    """The paper's rule from the model's own eager attention weights: the last token's softmax row,
    averaged over every head of the layer, top ``n_kept - 1`` earlier tokens plus the last one."""
    eager = tiny_model(kind, attn="eager")
    with torch.no_grad():
        out = eager(input_ids=torch.tensor([prompt]), output_attentions=True)
    lp = len(prompt)
    kept = []
    for attn in out.attentions:  # (1, Hq, Lp, Lp)
        row = attn[0, :, -1, : lp - 1].float().mean(dim=0)
        top = torch.topk(row, n_kept - 1).indices.tolist()
        kept.append(sorted(top + [lp - 1]))
    return kept


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("lp,n_kept", [(64, 16), (97, 40), (50, 2)])
def test_tova_matches_eager_reference(kind, lp, n_kept):
    prompt = random_prompt(lp, seed=lp)
    ours = kept_indices(tiny_model(kind), build("tova", budget=n_kept), prompt)
    for layer_idx, (heads, expected) in enumerate(zip(ours, _reference(kind, prompt, n_kept), strict=True)):
        for head in heads[0]:  # one ranking per layer: every KV head keeps the same tokens
            assert head.tolist() == expected, f"layer {layer_idx}"


def test_tova_is_snapkv_with_a_layer_wide_head_reduction(llama):
    prompt = random_prompt(120, seed=5)
    tova = kept_indices(llama, build("tova", budget=30), prompt)
    snap_layer = kept_indices(llama, build("snapkv", budget=30, window=1, kernel=1, group_reduce="layer"), prompt)
    assert all(torch.equal(a, b) for a, b in zip(tova, snap_layer, strict=True))
    per_group = kept_indices(llama, build("tova", budget=30, group_reduce="mean"), prompt)
    snap_group = kept_indices(llama, build("snapkv", budget=30, window=1, kernel=1), prompt)
    assert all(torch.equal(a, b) for a, b in zip(per_group, snap_group, strict=True))
    # The layer-wide ranking is a real change: with per-group means the KV heads disagree somewhere.
    assert any(not torch.equal(heads[0, 0], heads[0, 1]) for heads in per_group)
    with pytest.raises(ConfigError):
        build("tova", budget=8, group_reduce="median")
