"""The shared scoring toolkit against naive full-matrix references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dapq.scoring import apply_rope, attention_scores, pool_scores, reduce_groups


def _naive(q, k, qcols, valid, scaling, n_scored, reduce):
    """Materialise the whole (Q, S) attention with repeat_kv: the obvious implementation."""
    group = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(group, dim=1)
    logits = (q @ kk.transpose(-1, -2)) * scaling
    cols = torch.arange(k.shape[2])
    allowed = valid[:, None, None, :] & (cols[None, :] <= qcols[:, None])[None, None]
    probs = logits.masked_fill(~allowed, float("-inf")).softmax(-1)[..., :n_scored]
    return {"sum": probs.sum(2), "mean": probs.mean(2), "max": probs.amax(2)}[reduce]


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("block", [1, 3, 256])
def test_blockwise_scores_equal_full_matrix(reduce, block):
    torch.manual_seed(0)
    bsz, hq, hkv, n_q, n_k, d = 2, 6, 2, 7, 20, 8
    q, k = torch.randn(bsz, hq, n_q, d), torch.randn(bsz, hkv, n_k, d)
    qcols = torch.arange(n_k - n_q, n_k)
    valid = torch.ones(bsz, n_k, dtype=torch.bool)
    valid[1, :5] = False
    got = attention_scores(q, k, query_cols=qcols, key_valid=valid, scaling=0.3, n_scored=15,
                           query_reduce=reduce, block_size=block)
    want = _naive(q, k, qcols, valid, 0.3, 15, reduce)
    torch.testing.assert_close(got, want)
    assert torch.all(got[1, :, :5] == 0)  # padding gets no mass


def test_causal_mask_follows_physical_columns():
    """A query at column c only sees keys <= c: the first query sees one key, with all its mass."""
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 6, 4)
    scores = attention_scores(q, k, query_cols=torch.tensor([0, 1, 2]), key_valid=torch.ones(1, 6, dtype=torch.bool),
                              scaling=1.0, n_scored=6, query_reduce="max")
    assert torch.all(scores[..., 3:] == 0)
    torch.testing.assert_close(scores[..., 0], torch.ones(1, 2))


def test_padding_queries_are_ignored():
    q, k = torch.randn(1, 2, 4, 4), torch.randn(1, 2, 4, 4)
    valid = torch.tensor([[False, True, True, True]])
    scores = attention_scores(q, k, query_cols=torch.arange(4), key_valid=valid, scaling=1.0, n_scored=4,
                              query_reduce="mean", query_valid=valid)
    assert not torch.isnan(scores).any()
    torch.testing.assert_close(scores.sum(-1), torch.ones(1, 2))  # mean of 3 distributions sums to 1


def test_group_reduction_and_pooling():
    s = torch.arange(12.0).view(1, 4, 3)
    torch.testing.assert_close(reduce_groups(s, 2, "mean"), torch.tensor([[[1.5, 2.5, 3.5], [7.5, 8.5, 9.5]]]))
    torch.testing.assert_close(reduce_groups(s, 2, "max"), torch.tensor([[[3.0, 4.0, 5.0], [9.0, 10.0, 11.0]]]))
    # TOVA's layer-wide mean: all four heads, the same row for both KV heads.
    torch.testing.assert_close(reduce_groups(s, 2, "layer"), torch.tensor([[[4.5, 5.5, 6.5], [4.5, 5.5, 6.5]]]))
    x = torch.rand(2, 3, 17)
    torch.testing.assert_close(pool_scores(x, 5, "avg"), F.avg_pool1d(x, 5, 1, 2))
    torch.testing.assert_close(pool_scores(x, 5, "max"), F.max_pool1d(x, 5, 1, 2))
    assert torch.equal(pool_scores(x, 1, "max"), x)


def test_rope_matches_transformers():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q, cos, sin = torch.randn(2, 3, 5, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    want, _ = apply_rotary_pos_emb(q, q, cos, sin)
    torch.testing.assert_close(apply_rope(q, cos, sin), want)
