"""Budget schedules: Ada-KV's split of a layer's budget among its KV heads, against a plain loop."""

from __future__ import annotations

import math

import pytest
import torch

from dapq.methods.budgets import head_counts


def _loop_counts(scores: torch.Tensor, kept: list[int], floor: float) -> list[list[int]]:
    """Ada-KV written out: every head's best floor(floor * K) tokens (at least one), then the best remaining pairs."""
    out = []
    for row, k in zip(scores.tolist(), kept, strict=True):
        base = min(k, max(1, math.floor(floor * k))) if floor > 0 else 0
        ranked = [sorted(range(len(s)), key=lambda c, s=s: -s[c]) for s in row]  # stable: earlier column first
        rest = [(-row[h][c], h, r) for h, cols in enumerate(ranked) for r, c in enumerate(cols)
                if r >= base and row[h][c] != float("-inf")]
        counts = [base] * len(row)
        for _, h, _ in sorted(rest)[: len(row) * (k - base)]:
            counts[h] += 1
        out.append(counts)
    return out


@pytest.mark.parametrize("floor", [0.0, 0.05, 0.2, 0.5, 1.0])
def test_head_counts_equal_the_loop_and_keep_each_heads_best(floor):
    gen = torch.Generator().manual_seed(0)
    # Heads of very different concentration, ties (rounded scores), padding and forced tokens.
    scores = (torch.rand(3, 4, 30, generator=gen) ** torch.tensor([1.0, 4.0, 8.0, 0.5])[None, :, None]).round(decimals=2)
    scores[1, :, :6] = float("-inf")  # a left-padded row
    scores[2, :, -3:] = float("inf")  # an always-kept recent window
    kept = torch.tensor([10, 8, 12])
    counts, order = head_counts(scores, kept, floor)
    assert counts.tolist() == _loop_counts(scores, kept.tolist(), floor)
    assert counts.sum(dim=1).tolist() == (4 * kept).tolist()
    assert bool((counts >= (max(1, math.floor(floor * 8)) if floor else 0)).all())
    if floor == 1.0:
        assert counts.tolist() == [[k] * 4 for k in kept.tolist()]  # the flat split
    else:
        assert bool((counts != kept[:, None]).any())
    # What each head keeps is a prefix of its own ranking: never padding, always the forced tokens.
    for b in range(3):
        for h in range(4):
            cols = order[b, h, : counts[b, h]]
            assert bool(torch.isfinite(scores[b, h, cols]).logical_or(scores[b, h, cols] > 0).all())
            if b == 2:
                assert {27, 28, 29} <= set(cols.tolist())
