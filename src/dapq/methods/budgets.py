"""Budget schedules every method accepts: per layer (PyramidKV's pyramid) and per KV head (Ada-KV)."""

from __future__ import annotations

import torch
from torch import Tensor

#: The per-layer budget schedules every method accepts (``Method.layer_budget``).
LAYER_BUDGETS = ("flat", "pyramid")


def pyramid_budgets(budget: int, window: int, prompt_len: int, num_layers: int, beta: int = 20) -> list[int]:
    """KVCache-Factory's PyramidKV schedule, with the mean budget held exactly at ``budget``.

    With ``m = budget - window``: ``min = m // beta``, ``max = 2m - min``; if ``max`` exceeds
    what the prompt can supply it is clipped to ``prompt_len - window`` and ``min`` rebalanced;
    layer ``l`` keeps ``max - l * (max - min) / (L - 1) + window``. Prompts shorter than ``2m``
    get the flat budget everywhere.

    KVCache-Factory floors the step to an integer, which makes the mean budget drift above the
    requested one (by about 10% at budget 128 over 30 layers); here the linear ramp is rounded
    per layer and the rounding remainder spread over the first layers, so that comparisons with
    flat-budget methods are at exactly the same total memory.
    """
    m = budget - window
    if prompt_len <= budget or prompt_len < 2 * m or m <= 0 or num_layers == 1:
        return [budget] * num_layers
    low = m // beta
    high = 2 * m - low
    if high >= prompt_len - window:
        high = prompt_len - window
        low = 2 * m - high
    step = (high - low) / (num_layers - 1)
    ramp = [round(high - layer * step) for layer in range(num_layers)]
    surplus = m * num_layers - sum(ramp)
    for layer in range(abs(surplus)):
        ramp[layer % num_layers] += 1 if surplus > 0 else -1
    return [r + window for r in ramp]


#: How a layer's budget is shared among its KV heads (``Method.head_budget``).
HEAD_BUDGETS = ("flat", "adaptive")


def head_counts(scores: Tensor, kept: Tensor, floor: float) -> tuple[Tensor, Tensor]:
    """Ada-KV's split of one layer's budget among its KV heads (Feng et al., 2024, arXiv 2407.11550).

    A layer that keeps ``K`` tokens per KV head holds ``Hkv * K`` (head, token) pairs. The flat
    split gives every head ``K``. Ada-KV keeps the ``Hkv * K`` pairs of highest score across the
    layer's heads instead, so a head whose attention is concentrated on a few tokens gives slots to
    a head whose attention is spread, for the same total. Its safeguard first gives every head its
    own ``floor(floor * K)`` best tokens (at least one), so that no head is left empty; the rest
    goes to the best pairs of the layer.

    The scores must be comparable across heads: attention mass, as every query-scoring method here
    gives (their scores are softmax weights, summed or averaged over the observation queries).

    Parameters
    ----------
    scores : Tensor
        (B, Hkv, P) one layer's scores, ``-inf`` where a token may never be kept (padding) and
        ``+inf`` where it must be (an always-kept recent window).
    kept : Tensor
        (B,) ``K`` of each row, at most its prompt length.
    floor : float
        The share of ``K`` every head keeps whatever its scores (Ada-KV's safeguard).

    Returns
    -------
    counts : Tensor
        (B, Hkv) tokens each head keeps; each row sums to ``Hkv * K``.
    order : Tensor
        (B, Hkv, P) each head's columns by descending score (a stable sort: ties go to the earlier
        column, as in the flat split). Head ``h`` keeps ``order[b, h, :counts[b, h]]``: the pairs
        chosen across heads are, within each head, a prefix of this order.
    """
    bsz, n_kv, width = scores.shape
    ranked, order = scores.sort(dim=-1, descending=True, stable=True)
    # The safeguard's share of every head, (B,): at least one token when it is on (as kvpress's
    # AdaKVPress does), in float64 so that the floor is Python's int(K * floor).
    base = (kept.to(torch.float64) * floor).floor().long()
    if floor > 0:
        base = base.clamp(min=1).minimum(kept)
    rank = torch.arange(width, device=scores.device)
    # The safeguard's pairs are taken already; the rest of the layer's budget goes to the best of
    # the other pairs. A stable sort of the flattened (head, rank) pairs keeps each head's pairs in
    # rank order among equal scores, which is what makes the chosen pairs a prefix of each head.
    rest = ranked.masked_fill(rank[None, None, :] < base[:, None, None], float("-inf")).reshape(bsz, -1)
    best = rest.sort(dim=-1, descending=True, stable=True).indices
    chosen = torch.arange(n_kv * width, device=scores.device)[None, :] < (n_kv * (kept - base))[:, None]
    extra = torch.zeros(bsz, n_kv, dtype=torch.long, device=scores.device)
    extra.scatter_add_(1, best // width, chosen.long())
    return base[:, None] + extra, order
