"""Measures the analyses report: cosine similarity of queries or distributions, and token recall."""

from __future__ import annotations

import torch
from torch import Tensor


def cosine(a: Tensor, b: Tensor) -> Tensor:
    """Cosine similarity along the last axis (fp32)."""
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)


def keep_recall(kept: Tensor, reference: Tensor) -> Tensor:
    """|kept ∩ reference| / |reference| per leading index.

    ``kept`` (..., K1) and ``reference`` (..., K2) hold prompt column indices, e.g. per (layer,
    KV head); the oracle's top-K is the usual reference (the paper's Figure 3).
    """
    hits = (kept[..., :, None] == reference[..., None, :]).any(dim=-2)
    return hits.float().mean(dim=-1)
