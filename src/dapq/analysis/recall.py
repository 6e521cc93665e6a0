"""Decode-attention recall (the DapQ paper's Figure 3 and Table 8).

For a budget K, the reference keep set is the oracle's: the top-K prompt tokens of the real
decoding attention summed over the first T FullKV steps (GQA group mean, no pooling). For any
registered method the analysis runs the real compression engine on a copy of the prompt cache
and reports, per layer:

- recall: the share of the oracle's top-K the method keeps;
- cosine: the similarity between the method's softmax attention distribution over the prompt
  (mean over its observation queries) and the real decoding one (mean over the T steps).
"""

from __future__ import annotations

import torch

from ..cache import clone_cache
from ..compress import compress
from ..methods.base import Method
from ..scoring import attention_scores
from .decode import DecodeTrace
from .measures import cosine, keep_recall


def oracle_topk(trace: DecodeTrace, budget: int, n_kv_heads: int) -> torch.Tensor:
    """(L, Hkv, K) prompt columns with the most real decode attention, as the oracle keeps them."""
    summed = trace.attention.sum(dim=2)  # (L, Hq, Lp)
    n_layers, n_q, lp = summed.shape
    per_kv = summed.view(n_layers, n_kv_heads, n_q // n_kv_heads, lp).mean(dim=2)
    k = min(budget, lp)
    return per_kv.sort(dim=-1, descending=True, stable=True).indices[..., :k]


def method_recall(model, cache, prompt_ids: list[int], trace: DecodeTrace, method: Method, budget_ref: torch.Tensor,
                  tokenizer=None) -> dict:
    """Per-layer recall of the oracle's top-K and distribution cosine for one method."""
    distributions: dict[int, torch.Tensor] = {}

    def observe(ctx):
        if ctx.queries is None:
            return
        n_keys = method.softmax_keys(ctx)  # queries exist only for attention-scored methods
        distributions[ctx.layer_idx] = attention_scores(
            ctx.queries, ctx.keys[:, :, :n_keys], query_cols=ctx.query_cols, key_valid=ctx.valid[:, :n_keys],
            scaling=ctx.scaling, n_scored=ctx.width, query_reduce="mean", query_valid=ctx.query_valid,
        )[0]

    ids = torch.tensor([prompt_ids], device=model.device)
    result = compress(model, clone_cache(cache), method, ids, tokenizer=tokenizer, observer=observe)
    real = trace.attention.mean(dim=2)  # (L, Hq, Lp)
    recall, cos = [], []
    for layer, cached in enumerate(result.cache.layers):
        kept = cached.kept_columns(0)  # -1 at masked slots, which match no reference column
        recall.append(float(keep_recall(kept, budget_ref[layer]).mean()))
        if layer in distributions:
            cos.append(float(cosine(distributions[layer], real[layer]).mean()))
    return {"recall": recall, "cosine": cos or None}
