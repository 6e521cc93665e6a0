"""A physically pruned KV cache that still tells transformers the right positions.

After eviction, layer ``l`` physically holds ``C_l`` prompt slots (gathered, in original order)
plus the generated tokens. RoPE positions must stay the original ones: the next token is at
position Lp, not C_l. dapq always passes explicit ``position_ids``; what transformers still
derives from the cache is the mask's query offset (and ``cache_position`` up to 5.3,
:mod:`dapq.compat`), so :class:`CompressedCache` reports the *logical* length (physical +
evicted) from ``get_seq_length`` and hands the number of evicted slots to the mask builder as
``kv_offset``; a plain ``model.generate()`` then continues at the right positions too.

Why that offset gives the right padding mask: with left padding, row ``b`` of a batch of padded
width P keeps ``min(C, Lp_b)`` real tokens, laid out after ``C - min(C, Lp_b)`` masked slots. The
mask builder reads the user's *logical* 2-D mask at index ``kv_offset + j = P - C + j`` for
physical slot ``j``; that entry is padding exactly when ``j < C - Lp_b``. So a plain
``model.generate(..., attention_mask=<the original mask + ones>)`` masks exactly the padded
slots. Layouts where this does not hold (per-layer budgets with padding, or ratio budgets in a
batch) are flagged ``canonical = False``; :class:`dapq.decoding.DecodeStepper` then supplies
per-layer masks itself.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor
from transformers import DynamicCache


@dataclass
class LayerLayout:
    """Where the kept prompt tokens of one layer sit in its physical cache."""

    kept_indices: Tensor | None
    """(B, Hkv, C) padded-prompt column of each physical slot; None when nothing was evicted."""
    pad_slots: Tensor
    """(B,) leading physical slots of each row that are masked (padding)."""
    width: int
    """C, physical prompt slots of this layer."""


class CompressedCache(DynamicCache):
    """A :class:`~transformers.DynamicCache` whose prompt part was pruned by a dapq method."""

    def __init__(self) -> None:
        super().__init__()
        self.prompt_width = 0
        self.prompt_lengths: Tensor | None = None
        self.layouts: list[LayerLayout] = []
        self.stats = CompressionStats()

    # ---------------------------------------------------------------- transformers API
    def _offset(self, layer_idx: int) -> int:
        if layer_idx < len(self.layouts):
            return self.prompt_width - self.layouts[layer_idx].width
        return 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Logical length: the padded prompt width plus the columns appended since, evicted slots included.

        A batch-wide column count, not row ``b``'s next position (that is ``Lp_b + T``, which dapq
        passes explicitly).
        """
        physical = super().get_seq_length(layer_idx)
        return physical + self._offset(layer_idx) if physical else 0

    def get_query_offset(self, layer_idx: int = 0) -> int:
        """The mask's query offset (transformers 5.14+): the logical length, as ``get_seq_length``."""
        return self.get_seq_length(layer_idx)

    def get_mask_sizes(self, query, layer_idx: int) -> tuple[int, int]:
        """The mask's key axis: this layer's physical slots, read at logical offset ``kv_offset``.

        ``query`` is whatever this transformers release passes (``cache_position`` up to 5.3, the
        query length from 5.4; :mod:`dapq.compat`); it goes to the parent untouched.
        """
        kv_length, kv_offset = super().get_mask_sizes(query, layer_idx)
        return kv_length, kv_offset + self._offset(layer_idx)

    # ---------------------------------------------------------------- dapq API
    @property
    def canonical(self) -> bool:
        """True when the logical 2-D attention mask describes every layer (see module doc)."""
        if not self.layouts:
            return True
        widths = {layout.width for layout in self.layouts}
        if len(widths) != 1:
            return False
        width = widths.pop()
        expected = (width - self.prompt_lengths).clamp(min=0)
        return all(torch.equal(layout.pad_slots.cpu(), expected.cpu()) for layout in self.layouts)

    def slot_mask(self, layer_idx: int, tail: Tensor) -> Tensor:
        """(B, C_l + T) bool: which physical slots of a layer may be attended to.

        ``tail`` (B, T) marks which of the T columns appended after the prompt slots (a question,
        generated tokens) are real; padding inside a question block is False.
        """
        layout = self.layouts[layer_idx]
        slots = torch.arange(layout.width, device=layout.pad_slots.device)
        prompt = slots[None, :] >= layout.pad_slots[:, None]
        return torch.cat([prompt, tail.to(device=prompt.device, dtype=torch.bool)], dim=1)

    def select(self, rows: Sequence[int]) -> CompressedCache:
        """A new cache made of the given batch rows (repeats allowed), each with its own slots and padding.

        Context-only compression asks many questions of one compressed context this way: one row
        per question, decoded as one batch (:func:`dapq.context.ask`).
        """
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.layers[0].keys.device)
        out = CompressedCache()
        out.prompt_width = self.prompt_width
        out.prompt_lengths = self.prompt_lengths[index.to(self.prompt_lengths.device)]
        out.layouts = [LayerLayout(None if lay.kept_indices is None else lay.kept_indices[index.to(lay.kept_indices.device)],
                                   lay.pad_slots[index.to(lay.pad_slots.device)], lay.width) for lay in self.layouts]
        out.layers = []
        for layer in self.layers:
            new = copy.copy(layer)
            new.keys, new.values = layer.keys[index], layer.values[index]
            out.layers.append(new)
        per_row = [self.stats.kv_bytes_full // max(len(self.prompt_lengths), 1)] * len(index)
        out.stats = replace(self.stats, kv_bytes_full=sum(per_row), kv_bytes_kept=out.kv_bytes(),
                            budgets=[self.stats.budgets[i] for i in index.tolist()] if self.stats.budgets else [])
        return out

    def kept_per_layer(self) -> list[int]:
        """Physical prompt slots per KV head, per layer."""
        return [layout.width for layout in self.layouts]

    def repeat_batch(self, n: int) -> CompressedCache:
        """A new cache holding every row ``n`` times (row order ``0..B-1, 0..B-1, ...``).

        The speed benchmark uses it to measure decoding at batch ``n`` without ``n`` prefills:
        decode cost depends on the cache's shape, not on its values.
        """
        return CompressedCache.stack([self] * n)

    @classmethod
    def stack(cls, caches: list[CompressedCache]) -> CompressedCache:
        """One batch made of the rows of several caches with the same per-layer widths.

        Sweeps use it to decode many methods' caches of one prompt together (see
        :func:`dapq.generation.generate_many`): each row keeps its own kept slots and padding.
        """
        first = caches[0]
        widths = first.kept_per_layer()
        if any(c.kept_per_layer() != widths or c.prompt_width != first.prompt_width for c in caches):
            raise ValueError("only caches with the same prompt width and per-layer widths can be stacked")
        out = cls()
        out.prompt_width = first.prompt_width
        out.prompt_lengths = torch.cat([c.prompt_lengths for c in caches])
        out.layouts = []
        for i, width in enumerate(widths):
            lays = [c.layouts[i] for c in caches]
            indices = None
            if any(lay.kept_indices is not None for lay in lays):
                # A layer that evicted nothing holds every column in order.
                indices = torch.cat([lay.kept_indices if lay.kept_indices is not None else
                                     torch.arange(width, device=lay.pad_slots.device).expand(
                                         len(lay.pad_slots), caches[k].layers[i].keys.shape[1], -1)
                                     for k, lay in enumerate(lays)])
            out.layouts.append(LayerLayout(indices, torch.cat([lay.pad_slots for lay in lays]), width))
        out.layers = []
        for i, layer in enumerate(first.layers):
            new = copy.copy(layer)
            new.keys = torch.cat([c.layers[i].keys for c in caches])
            new.values = torch.cat([c.layers[i].values for c in caches])
            out.layers.append(new)
        out.stats = replace(first.stats, kv_bytes_full=sum(c.stats.kv_bytes_full for c in caches),
                            kv_bytes_kept=sum(c.stats.kv_bytes_kept for c in caches),
                            budgets=[row for c in caches for row in c.stats.budgets])
        return out

    def kv_bytes(self) -> int:
        """Bytes held by keys and values of every layer right now."""
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.layers if layer.is_initialized)


def clone_cache(cache: DynamicCache) -> DynamicCache:
    """An independent plain copy of a cache's keys and values (compression mutates what it is given)."""
    out = DynamicCache()
    for i, layer in enumerate(cache.layers):
        out.update(layer.keys.clone(), layer.values.clone(), i)
    return out


@dataclass
class CompressionStats:
    """Figures a compression step reports (seconds and bytes)."""

    prefill_s: float = 0.0
    compress_s: float = 0.0
    kv_bytes_full: int = 0
    kv_bytes_kept: int = 0
    budgets: list[list[int]] = field(default_factory=list)
    """Budget of every (row, layer), before clamping to the prompt length."""
