"""Query similarity (the DapQ paper's Table 1, Figure 2): does position or content matter more?

For one prompt, the real decoding queries of the first N FullKV steps are compared by cosine
similarity with pseudo queries built under four conditions:

- SC&SP: same content (the real generated tokens), same positions (Lp ..);
- DC&SP: different content (random vocabulary tokens), same positions;
- SC&DP: same content, different positions (a random span inside [0, Lp));
- DC&DP: different content and positions.

Similarities are averaged over heads and the N query slots, per layer, before and after RoPE.
"""

from __future__ import annotations

import random

import torch

from .decode import DecodeTrace, queries_at
from .measures import cosine

CONDITIONS = ("SC&SP", "DC&SP", "SC&DP", "DC&DP")


def _per_layer(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    return cosine(a, b).mean(dim=(1, 2)).tolist()  # (L, Hq, n) -> (L,)


def similarity_trial(model, cache, trace: DecodeTrace, *, n: int, seed: int) -> dict:
    """Per-layer cosine similarities (pre- and post-RoPE) for the four conditions."""
    rng = random.Random(seed)
    lp = trace.prompt_len
    real_tokens = trace.tokens[:n]
    other_tokens = [rng.randrange(model.config.vocab_size) for _ in range(n)]
    start = rng.randrange(0, max(lp - n, 1))
    same_pos, other_pos = list(range(lp, lp + n)), list(range(start, start + n))
    out = {}
    for name, tokens, positions in (("SC&SP", real_tokens, same_pos), ("DC&SP", other_tokens, same_pos),
                                    ("SC&DP", real_tokens, other_pos), ("DC&DP", other_tokens, other_pos)):
        pre, post = queries_at(model, cache, lp, tokens, positions)
        out[name] = {"pre": _per_layer(pre, trace.queries_pre[:, :, :n]),
                     "post": _per_layer(post, trace.queries_post[:, :, :n])}
    return out


def offset_curve(model, cache, trace: DecodeTrace, *, n: int, offsets: list[int]) -> dict[int, float]:
    """Mean post-RoPE similarity of same-content pseudo queries starting at Lp + offset (Fig. 2b)."""
    lp = trace.prompt_len
    curve = {}
    for off in offsets:
        start = lp + off
        if start < 0:
            continue
        _, post = queries_at(model, cache, lp, trace.tokens[:n], list(range(start, start + n)))
        curve[off] = float(cosine(post, trace.queries_post[:, :, :n]).mean())
    return curve
