"""LaCache's ladder-shaped KV cache, one-shot after prefill (Shi et al., ICML 2025, arXiv 2507.14204)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from ..errors import ConfigError
from .base import LayerContext, Method, param
from .registry import register


def ladder_shape(num_layers: int, span: int, overlap: int) -> tuple[int, int]:
    """Block length B and tokens kept per block A of the ladder.

    ``B = 1 + ceil((L - S) / (S - O))`` and ``A = min(ceil(S / (S - O)), B)``: each layer keeps A
    consecutive tokens of every block of B, and consecutive layers shift that run by one, so
    together the layers cover the whole span like the rungs of a ladder.
    """
    step = span - overlap
    block = 1 + math.ceil(max(num_layers - span, 0) / step)
    keep = min(math.ceil(span / step), block)
    return block, keep


@register
@dataclass
class LaCache(Method):
    """The LaCache ladder, applied once after prefill with the original positions kept.

    The original compacts again after every decode step and re-rotates keys to cache slots; this
    is the one-shot variant the DapQ paper compares against. The cache of every layer is
    ``sinks`` first tokens + a laddered middle + the ``keep_recent`` last tokens; all heads of a layer
    keep the same tokens and no attention scores are used.

    Parameters
    ----------
    span : int, optional
        Ladder span S in layers (default: half the layers).
    overlap : int, optional
        Overlap O between consecutive rungs (default: S // 4).
    sinks : int
        First tokens always kept.
    keep_recent : int
        Last tokens always kept.
    """

    name: ClassVar[str] = "lacache"
    paper: ClassVar[str] = "LaCache (Shi et al., 2025)"

    span: int | None = param(None, ge=1)
    overlap: int | None = param(None, ge=0)
    sinks: int = param(4, ge=0)
    keep_recent: int = param(16, ge=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.span is not None and self.overlap is not None and not self.overlap < self.span:
            raise ConfigError("overlap must satisfy 0 <= overlap < span")

    def _shape(self, num_layers: int) -> tuple[int, int]:
        span = self.span or max(1, math.ceil(num_layers / 2))
        overlap = self.overlap if self.overlap is not None else span // 4
        return ladder_shape(num_layers, span, overlap)

    def score(self, ctx: LayerContext) -> Tensor:
        block, keep = self._shape(ctx.num_layers)
        start = ctx.layer_idx % (block - keep + 1)
        pos = ctx.positions
        lengths = ctx.prompt_lengths[:, None]
        # Distance from the start of the recent tail, counted backwards: the ladder is laid from
        # the tail towards the sinks, so the rungs nearest the question are kept first.
        dist = (lengths - self.keep_recent - 1 - pos).float()
        in_block = torch.remainder(dist, block)
        on_rung = (in_block >= start) & (in_block < start + keep)
        # Order: sinks, recent tail, ladder rungs nearest first, then the rest nearest first.
        scores = torch.where(on_rung, 2.0**22 - dist, -dist)
        scores = torch.where(pos >= lengths - self.keep_recent, 2.0**23 + pos.float(), scores)
        scores = torch.where(pos < self.sinks, torch.full_like(scores, 2.0**24), scores)
        return scores[:, None, :].expand(-1, ctx.n_kv_heads, -1)
