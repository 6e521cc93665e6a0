"""The state a prefill hands to decoding: the padded batch, and the compressed cache with its logits.

A leaf module: the engine (:mod:`dapq.compress`) makes these, the decode steps
(:mod:`dapq.decoding`) and the generate APIs read them, and neither has to import the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .cache import CompressedCache, CompressionStats


@dataclass
class PromptBatch:
    """Left-padded prompts, optionally followed by the method's extra (pseudo) tokens."""

    input_ids: Tensor
    """(B, P + X) token ids."""
    attention_mask: Tensor
    """(B, P + X), 0 at padding."""
    position_ids: Tensor
    """(B, P + X) RoPE positions; the pseudo tokens carry their assigned positions."""
    prompt_lengths: Tensor
    """(B,) real prompt lengths Lp."""
    width: int
    """P, the padded prompt width."""

    @property
    def extra(self) -> int:
        return self.input_ids.shape[1] - self.width

    def repeat(self, n: int) -> PromptBatch:
        """Every row ``n`` times (see :meth:`PrefillResult.repeat`)."""
        return PromptBatch.stack([self] * n)

    def select(self, rows: Sequence[int]) -> PromptBatch:
        """The given rows (repeats allowed), in that order."""
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.input_ids.device)
        return PromptBatch(self.input_ids[index], self.attention_mask[index], self.position_ids[index],
                           self.prompt_lengths[index], self.width)

    def with_tokens(self, tokens: Tensor) -> PromptBatch:
        """The prompt columns followed by ``tokens`` (B, T) at each row's positions Lp, Lp+1, ..."""
        width = self.width
        steps = torch.arange(tokens.shape[1], device=tokens.device)
        return PromptBatch(
            input_ids=torch.cat([self.input_ids[:, :width], tokens], dim=1),
            attention_mask=torch.cat([self.attention_mask[:, :width], torch.ones_like(tokens)], dim=1),
            position_ids=torch.cat([self.position_ids[:, :width], self.prompt_lengths[:, None] + steps], dim=1),
            prompt_lengths=self.prompt_lengths,
            width=width,
        )

    @classmethod
    def stack(cls, batches: list[PromptBatch]) -> PromptBatch:
        """The prompt columns of batches of the same padded width, as one batch.

        Extra (pseudo) columns are dropped: they differ between methods and are evicted anyway.
        """
        width = batches[0].width
        if any(b.width != width for b in batches):
            raise ValueError("only batches of the same padded width can be stacked")
        cat = lambda name: torch.cat([getattr(b, name)[:, :width] for b in batches])  # noqa: E731
        return cls(cat("input_ids"), cat("attention_mask"), cat("position_ids"),
                   torch.cat([b.prompt_lengths for b in batches]), width)


@dataclass
class PrefillResult:
    """A compressed cache, the logits of the first new token and the batch it came from."""

    cache: CompressedCache
    logits: Tensor | None
    """(B, V) float logits at the last prompt position, or None (see :func:`compress`)."""
    batch: PromptBatch

    @property
    def stats(self) -> CompressionStats:
        return self.cache.stats

    def repeat(self, n: int) -> PrefillResult:
        """The same state with every row ``n`` times: a batch-``n`` decode without ``n`` prefills."""
        return PrefillResult.stack([self] * n)

    @classmethod
    def stack(cls, states: list[PrefillResult]) -> PrefillResult:
        """Several states with the same per-layer cache widths as one batch (rows in order)."""
        logits = None if any(s.logits is None for s in states) else torch.cat([s.logits for s in states])
        return cls(cache=CompressedCache.stack([s.cache for s in states]), logits=logits,
                   batch=PromptBatch.stack([s.batch for s in states]))
