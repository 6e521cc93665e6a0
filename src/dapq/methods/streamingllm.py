"""StreamingLLM: attention sinks plus a recent window (Xiao et al., 2024, arXiv 2309.17453)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from .base import LayerContext, Method, param
from .registry import register


@register
@dataclass
class StreamingLLM(Method):
    """Keep the first ``sinks`` tokens and the most recent ``budget - sinks``.

    Parameters
    ----------
    sinks : int
        Attention-sink tokens at the start of the prompt (4 in the paper and KVCache-Factory).
    """

    name: ClassVar[str] = "streamingllm"
    paper: ClassVar[str] = "StreamingLLM (Xiao et al., 2024)"
    layer_invariant: ClassVar[bool] = True

    sinks: int = param(4, ge=0)

    def score(self, ctx: LayerContext) -> Tensor:
        pos = ctx.positions.float()
        # Sinks outrank everything, then recency; integers below 2^24 are exact in fp32.
        scores = torch.where(ctx.positions < self.sinks, torch.full_like(pos, 2.0**23), pos)
        return scores[:, None, :].expand(-1, ctx.n_kv_heads, -1)
