"""The shared scoring toolkit: every attention-scored method is built from these few functions.

A compression method needs, at each layer, some *observation queries* (the last prompt tokens for
SnapKV, every prompt token for H2O, the appended pseudo tokens for DapQ), their attention over the
prompt's keys, and a reduction of that attention to one importance score per (KV head, key).

Keeping the query projection, RoPE and the GQA bookkeeping here means each method file only states
*which* queries it uses and *how* it reduces them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

QUERY_REDUCTIONS = ("sum", "mean", "max")
GROUP_REDUCTIONS = ("mean", "max", "layer")
POOL_MODES = ("max", "avg")


def rotate_half(x: Tensor) -> Tensor:
    """The RoPE helper of the Llama family: ``[-x2, x1]`` for ``x = [x1, x2]``."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` (B, H, Q, d) by RoPE tables ``cos``/``sin`` of shape (B, Q, d).

    The tables are the ones the model itself computed for this forward pass (the
    ``position_embeddings`` argument of the attention module), so any RoPE scaling the model uses
    (linear, dynamic, llama3, yarn) is applied exactly as in the model.
    """
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


def prerope_queries(attn: torch.nn.Module, hidden_states: Tensor) -> Tensor:
    """Queries (B, Hq, Q, d) before RoPE: ``q_proj``, then ``q_norm`` where the model has one (Qwen3)."""
    bsz, q_len, _ = hidden_states.shape
    q = attn.q_proj(hidden_states).view(bsz, q_len, -1, attn.head_dim)
    q_norm = getattr(attn, "q_norm", None)
    if q_norm is not None:
        q = q_norm(q)
    return q.transpose(1, 2)


def project_queries(attn: torch.nn.Module, hidden_states: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Recompute post-RoPE queries (B, Hq, Q, d) for ``hidden_states`` (B, Q, hidden).

    The attention module does not return its queries, so they are recomputed for the few
    observation tokens only, then rotated with the RoPE tables of this forward pass.
    """
    return apply_rope(prerope_queries(attn, hidden_states), cos, sin)


def attention_probs(queries: Tensor, keys: Tensor, scaling: float) -> Tensor:
    """Per-query softmax attention (B, Hq, Q, S) in fp32 over all ``keys``, for a few queries.

    Used by the analyses to compare distributions query by query; for scoring many queries use
    :func:`attention_scores`, which never holds more than one block.
    """
    bsz, n_q_heads, n_queries, head_dim = queries.shape
    n_kv_heads = keys.shape[1]
    q = queries.float().view(bsz, n_kv_heads, n_q_heads // n_kv_heads, n_queries, head_dim)
    logits = torch.matmul(q, keys.float().unsqueeze(2).transpose(-1, -2)) * scaling
    return torch.softmax(logits, dim=-1).reshape(bsz, n_q_heads, n_queries, -1)


def attention_scores(
    queries: Tensor,
    keys: Tensor,
    *,
    query_cols: range | Tensor,
    key_valid: Tensor | None,
    scaling: float,
    n_scored: int,
    query_reduce: str = "sum",
    query_valid: Tensor | None = None,
    block_size: int = 256,
) -> Tensor:
    """Softmax attention of ``queries`` over ``keys``, reduced over the queries.

    Parameters
    ----------
    queries : Tensor
        (B, Hq, Q, d) post-RoPE queries.
    keys : Tensor
        (B, Hkv, S, d) post-RoPE keys, physical column ``j`` of the forward pass at index ``j``.
    query_cols : range or Tensor
        Physical column of each query. Attention is causal in physical order: a query at column
        ``c`` sees keys ``j <= c``. That is the mask the model used in prefill. A ``range`` (what
        the engine passes) costs no device-to-host copy; a tensor costs one.
    key_valid : Tensor, optional
        (B, S) bool; False for padding. None when every key is real (no mask, no host sync).
    scaling : float
        The model's softmax scale (``1/sqrt(d)``).
    n_scored : int
        Return scores for keys ``[:n_scored]`` only. The softmax still normalizes over every
        visible key in ``[:S]``: passing prompt + pseudo keys with ``n_scored = P`` gives the
        "normalize over prompt plus pseudo keys" variant of DapQ.
    query_reduce : {"sum", "mean", "max"}
        How the Q distributions are combined (SnapKV sums, kvpress averages; for top-k the two are
        equivalent).
    query_valid : Tensor, optional
        (B, Q) bool; queries at padding columns are ignored. None when every query is real.
    block_size : int
        Queries are processed in blocks so that memory stays O(block_size * S), never O(S^2),
        which matters for H2O where every prompt token is a query.

    Returns
    -------
    Tensor
        (B, Hq, n_scored) float32 scores.
    """
    if query_reduce not in QUERY_REDUCTIONS:
        raise ValueError(f"query_reduce must be one of {QUERY_REDUCTIONS}")
    bsz, n_q_heads, n_queries, head_dim = queries.shape
    n_kv_heads, n_keys = keys.shape[1], keys.shape[2]
    group = n_q_heads // n_kv_heads
    # Scores are always accumulated in fp32: in bf16 the small tail probabilities that decide the
    # last kept slots would be rounded away.
    k32 = keys.float().transpose(-1, -2)  # (B, Hkv, d, S)
    key_cols = torch.arange(n_keys, device=keys.device)
    # Column bounds are decided on the host: one copy here instead of a device sync per block.
    query_cols = query_cols if isinstance(query_cols, range) else query_cols.tolist()
    if key_valid is not None and bool(key_valid.all()):
        key_valid = None
    if query_valid is not None and bool(query_valid.all()):
        query_valid = None  # an unpadded batch: plain reductions are cheaper than weighted ones
    acc = torch.zeros(bsz, n_kv_heads, group, n_scored, device=keys.device)
    for start in range(0, n_queries, block_size):
        stop = min(start + block_size, n_queries)
        b = stop - start
        cols = query_cols[start:stop]
        # Keys after the block's last query are invisible to all of it: skip them, which halves
        # the work of H2O's causal column sums.
        horizon = min(n_keys, max(cols) + 1)
        # GQA: fold the G query heads of a group into the query axis, so one plain batched matmul
        # per KV head does the work (a broadcast over a group axis costs ~3x on the CPU) and no
        # repeat_kv copy of the keys is made.
        q = queries[:, :, start:stop].float().reshape(bsz, n_kv_heads, group * b, head_dim)
        logits = torch.matmul(q, k32[..., :horizon]).mul_(scaling).view(bsz, n_kv_heads, group, b, horizon)
        # Masking costs as much as the softmax; skip it when every query of the block sees every
        # key (DapQ's pseudo queries over the keys of an unpadded prompt).
        masked = key_valid is not None or min(cols) < horizon - 1
        if masked:
            logits.masked_fill_(~_visible(cols, key_cols[:horizon], key_valid), float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if masked:
            probs.nan_to_num_(nan=0.0)  # a query with no visible key (H2O's padding queries) gives NaN rows
        probs = probs[..., : min(n_scored, horizon)]
        width = probs.shape[-1]
        if query_valid is not None:
            qv = query_valid[:, start:stop].to(probs.dtype)
            if query_reduce == "max":
                block = (probs * qv[:, None, None, :, None]).amax(dim=3)
            else:
                block = torch.einsum("bhgqs,bq->bhgs", probs, qv)  # weighted sum without a copy
        else:
            block = probs.amax(dim=3) if query_reduce == "max" else probs.sum(dim=3)
        if query_reduce == "max":
            torch.maximum(acc[..., :width], block, out=acc[..., :width])
        else:
            acc[..., :width] += block
    scores = acc.reshape(bsz, n_q_heads, n_scored)
    if query_reduce == "mean":
        if query_valid is None:
            count = torch.full((bsz,), float(n_queries), device=scores.device)
        else:
            count = query_valid.sum(dim=1).clamp(min=1).float()
        scores = scores / count[:, None, None]
    return scores


def _visible(cols, key_cols: Tensor, key_valid: Tensor | None) -> Tensor:
    """(B or 1, 1, 1, Q, S) which keys each query of a block sees: causal, and real keys only."""
    cols_t = torch.as_tensor(list(cols), device=key_cols.device)
    visible = (key_cols[None, :] <= cols_t[:, None])[None, None, None]
    if key_valid is not None:
        visible = visible & key_valid[:, None, None, None, : key_cols.shape[0]]
    return visible


def reduce_groups(scores: Tensor, n_kv_heads: int, mode: str = "mean") -> Tensor:
    """Combine per-query-head scores (B, Hq, S) into per-KV-head scores (B, Hkv, S).

    Under GQA the G query heads of a group share one KV head, so one keep set must serve all of
    them. ``mean`` follows SnapKV's reference code; ``max`` protects a token that only one head
    of the group needs; ``layer`` averages over *all* query heads and gives every KV head that one
    ranking, so a layer keeps the same tokens in each head (TOVA, Oren et al. 2024, Section 3).
    """
    if mode not in GROUP_REDUCTIONS:
        raise ValueError(f"group reduction must be one of {GROUP_REDUCTIONS}")
    bsz, n_q_heads, n_keys = scores.shape
    if mode == "layer":
        return scores.mean(dim=1, keepdim=True).expand(bsz, n_kv_heads, n_keys)
    grouped = scores.view(bsz, n_kv_heads, n_q_heads // n_kv_heads, n_keys)
    return grouped.mean(dim=2) if mode == "mean" else grouped.amax(dim=2)


def pool_scores(scores: Tensor, kernel: int, mode: str = "max") -> Tensor:
    """1-D pooling along the key axis (SnapKV's clustering step), stride 1, same length.

    Scores are non-negative attention mass, so padding with zeros (avg: ``count_include_pad``)
    is what SnapKV and kvpress do, and it makes a left-padded batch row pool exactly like the
    same prompt alone.
    """
    if kernel <= 1:
        return scores
    if mode not in POOL_MODES:
        raise ValueError(f"pool mode must be one of {POOL_MODES}")
    shape = scores.shape
    flat = scores.reshape(-1, 1, shape[-1])
    if mode == "avg":
        pooled = F.avg_pool1d(flat, kernel_size=kernel, stride=1, padding=kernel // 2)
    else:
        pooled = F.max_pool1d(flat, kernel_size=kernel, stride=1, padding=kernel // 2)
    return pooled[..., : shape[-1]].reshape(shape)
