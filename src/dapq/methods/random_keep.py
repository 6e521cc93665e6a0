"""A random keep set: the floor every scored method has to beat."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from .base import LayerContext, Method, param
from .registry import register


@register
@dataclass
class RandomKeep(Method):
    """Keep ``budget`` prompt tokens drawn uniformly at random, per layer and KV head.

    The draw depends on (seed, layer, head, logical position) only, so a prompt keeps the same
    tokens alone or inside a padded batch.
    """

    name: ClassVar[str] = "random"
    paper: ClassVar[str] = "-"

    seed: int = param(0, ge=0)

    def score(self, ctx: LayerContext) -> Tensor:
        gen = torch.Generator().manual_seed(self.seed * 100_003 + ctx.layer_idx)
        max_pos = int(ctx.positions.max().item()) + 1
        # Position-major draw: the value of (position p, head h) is the (p * Hkv + h)-th number
        # of the stream, whatever the longest prompt of the batch is.
        table = torch.rand(max(max_pos, 1), ctx.n_kv_heads, generator=gen).to(ctx.keys.device)
        pos = ctx.positions.clamp(min=0)
        return table[pos].permute(0, 2, 1)  # (B, Hkv, P)
