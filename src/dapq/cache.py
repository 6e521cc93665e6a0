"""A physically pruned KV cache that still tells transformers the right positions.

After eviction, layer ``l`` physically holds ``C_l`` prompt slots (gathered, in original order)
plus the generated tokens. RoPE positions must stay the original ones: the next token is at
position Lp, not C_l. dapq always passes explicit ``position_ids``; what transformers still
derives from the cache is the mask's query offset (and ``cache_position`` up to 5.3,
:mod:`dapq.compat`). So, as transformers' own ``DynamicSlidingWindowLayer`` does for a layer whose
logical length differs from its physical one, each :class:`CompressedLayer` reports the *logical*
length (physical + evicted) from ``get_seq_length`` and hands its number of evicted slots to the
mask builder as ``kv_offset``; a plain ``model.generate()`` then continues at the right positions.

Why that offset gives the right padding mask: with left padding, row ``b`` of a batch of padded
width P keeps ``min(C, Lp_b)`` real tokens, laid out after ``C - min(C, Lp_b)`` masked slots. The
mask builder reads the user's *logical* 2-D mask at index ``kv_offset + j = P - C + j`` for
physical slot ``j``; that entry is padding exactly when ``j < C - Lp_b``. So a plain
``model.generate(..., attention_mask=<the original mask + ones>)`` masks exactly the padded
slots. Layouts where this does not hold (per-layer budgets with padding, kept fractions in a
batch, or KV heads that keep different counts) are flagged ``canonical = False``; :class:`dapq.decoding.DecodeStepper` then supplies
per-layer masks itself.

Each layer owns its state (kept indices, padding slots, evicted count); the cache is a list of
layers plus the figures of the step that compressed it, so selecting or stacking batch rows is
one loop over layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from . import compat


class CompressedLayer(DynamicLayer):
    """One layer's cache after eviction: kept prompt slots, then whatever was appended since.

    Parameters
    ----------
    keys, values : Tensor
        (B, Hkv, C + T, d) physical slots: ``C`` kept prompt slots, then ``T`` appended columns.
    kept_indices : Tensor, optional
        (B, Hkv, C) padded-prompt column of each prompt slot; None when nothing was evicted (the
        slots are the prompt columns in order).
    pad_slots : Tensor
        (B,) leading prompt slots of each row that are masked (padding), or (B, Hkv) when the KV
        heads keep different counts (``head_budget="adaptive"``): each head's masked slots.
    prompt_lengths : Tensor
        (B,) real prompt length of each row.
    prompt_width : int
        P, the padded prompt width the slots were selected from.
    prompt_slots : int, optional
        C, when ``keys`` already holds appended columns (default: all of ``keys`` is prompt).
    """

    def __init__(self, keys: Tensor, values: Tensor, *, kept_indices: Tensor | None, pad_slots: Tensor,
                 prompt_lengths: Tensor, prompt_width: int, prompt_slots: int | None = None):
        super().__init__()
        self.keys, self.values = keys, values
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self.kept_indices = kept_indices
        self.pad_slots = pad_slots
        self.prompt_lengths = prompt_lengths
        self.prompt_width = prompt_width
        self.prompt_slots = keys.shape[2] if prompt_slots is None else prompt_slots
        """C, the physical prompt slots of this layer."""

    @classmethod
    def whole(cls, keys: Tensor, values: Tensor, prompt_lengths: Tensor) -> CompressedLayer:
        """A layer that evicted nothing: every padded prompt column in order."""
        width = keys.shape[2]
        return cls(keys, values, kept_indices=None, pad_slots=width - prompt_lengths, prompt_lengths=prompt_lengths,
                   prompt_width=width)

    @property
    def evicted(self) -> int:
        """Logical columns minus physical slots: the mask's ``kv_offset`` and the position gap."""
        return self.prompt_width - self.prompt_slots

    # ---------------------------------------------------------------- transformers API
    def get_seq_length(self) -> int:
        """Logical length: the padded prompt width plus the columns appended since, evicted slots included.

        A batch-wide column count, not row ``b``'s next position (that is ``Lp_b + T``, which dapq
        passes explicitly).
        """
        physical = super().get_seq_length()
        return physical + self.evicted if physical else 0

    def get_mask_sizes(self, query) -> tuple[int, int]:
        """The mask's key axis: this layer's physical slots, read at logical offset ``kv_offset``.

        ``query`` is whatever this transformers release passes (``cache_position`` up to 5.3, the
        query length from 5.4; :func:`dapq.compat.query_length`).
        """
        return self.keys.shape[2] + compat.query_length(query), self.evicted

    # ---------------------------------------------------------------- dapq API
    @property
    def head_wise(self) -> bool:
        """True when the KV heads keep different counts: only a per-head mask describes this layer."""
        return self.pad_slots.dim() == 2

    @property
    def canonical(self) -> bool:
        """True when the logical 2-D mask describes this layer's padding (see the module doc)."""
        if self.head_wise:
            return False
        expected = (self.prompt_slots - self.prompt_lengths).clamp(min=0)
        return torch.equal(self.pad_slots.cpu(), expected.cpu())

    def kept_tokens(self, row: int) -> int:
        """Real prompt tokens row ``row`` keeps per KV head (padding slots excluded; the mean over
        heads when they keep different counts, which is the budget: their total is fixed)."""
        pad = self.pad_slots[row]
        return self.prompt_slots - int(pad.sum()) // pad.numel()

    def slot_mask(self, tail: Tensor) -> Tensor:
        """(B, C + T) bool, or (B, Hkv, C + T) for a head-wise layer: which physical slots may be attended to.

        ``tail`` (B, T) marks which of the T columns appended after the prompt slots (a question,
        generated tokens) are real; padding inside a question block is False.
        """
        prompt = self._real_slots()
        tail = tail.to(device=prompt.device, dtype=torch.bool)
        if self.head_wise:
            tail = tail[:, None, :].expand(-1, prompt.shape[1], -1)
        return torch.cat([prompt, tail], dim=-1)

    def _real_slots(self) -> Tensor:
        """(B, C), or (B, Hkv, C) for a head-wise layer: which prompt slots hold a kept token."""
        return torch.arange(self.prompt_slots, device=self.pad_slots.device) >= self.pad_slots[..., None]

    def indices(self) -> Tensor:
        """(B, Hkv, C) kept prompt columns, also when nothing was evicted."""
        if self.kept_indices is not None:
            return self.kept_indices
        bsz, n_kv = self.keys.shape[:2]
        return torch.arange(self.prompt_slots, device=self.pad_slots.device).expand(bsz, n_kv, -1)

    def kept_columns(self, row: int) -> Tensor:
        """(Hkv, C) the prompt columns row ``row`` attends to per KV head, -1 at its masked slots
        (padding, or a head's slots beyond its count)."""
        return self.indices()[row].masked_fill(~self._real_slots()[row], -1)

    def select(self, rows: Tensor) -> CompressedLayer:
        """The given batch rows (repeats allowed), each with its own slots and padding."""
        pick = lambda t: None if t is None else t[rows.to(t.device)]  # noqa: E731
        return CompressedLayer(self.keys[rows], self.values[rows], kept_indices=pick(self.kept_indices),
                               pad_slots=pick(self.pad_slots), prompt_lengths=pick(self.prompt_lengths),
                               prompt_width=self.prompt_width, prompt_slots=self.prompt_slots)

    @classmethod
    def stack(cls, layers: Sequence[CompressedLayer]) -> CompressedLayer:
        """The rows of several layers with the same slot count and prompt width, as one batch."""
        first = layers[0]
        if any(lay.prompt_slots != first.prompt_slots or lay.prompt_width != first.prompt_width for lay in layers):
            raise ValueError("only layers with the same prompt width and slot count can be stacked")
        evicted = any(lay.kept_indices is not None for lay in layers)
        pads = [lay.pad_slots for lay in layers]
        if any(lay.head_wise for lay in layers):  # a flat row is a head-wise row with equal heads
            pads = [p if p.dim() == 2 else p[:, None].expand(-1, lay.keys.shape[1]) for p, lay in zip(pads, layers, strict=True)]
        return cls(torch.cat([lay.keys for lay in layers]), torch.cat([lay.values for lay in layers]),
                   kept_indices=torch.cat([lay.indices() for lay in layers]) if evicted else None,
                   pad_slots=torch.cat(pads),
                   prompt_lengths=torch.cat([lay.prompt_lengths for lay in layers]), prompt_width=first.prompt_width,
                   prompt_slots=first.prompt_slots)

    def reserve(self, columns: int) -> CompressedLayer:
        """This layer with room for ``columns`` more appended columns written in place (:class:`PreallocatedLayer`)."""
        return PreallocatedLayer(self, columns)


class PreallocatedLayer(CompressedLayer):
    """A compressed layer whose buffers are sized once, kept slots + new columns, and written in place.

    The same state as :class:`CompressedLayer`; only the storage differs. ``update`` copies the new
    keys and values into the next free columns of two buffers allocated once, instead of
    concatenating (a ``torch.cat`` per step copies the whole cache, which is what keeps a
    growing cache's decode from scaling with the batch). ``keys``/``values`` are views of the
    filled part, so attention reads exactly what the growing layer would hold. Past its capacity
    it grows by doubling, so a wrong estimate costs time, never a result.

    Parameters
    ----------
    layer : CompressedLayer
        The layer to move into the buffers (copied once).
    columns : int
        Columns to reserve after what ``layer`` already holds.
    """

    def __init__(self, layer: CompressedLayer, columns: int):
        filled = layer.keys.shape[2]
        self._k = _buffer(layer.keys, filled + columns)
        self._v = _buffer(layer.values, filled + columns)
        super().__init__(self._k[:, :, :filled], self._v[:, :, :filled], kept_indices=layer.kept_indices,
                         pad_slots=layer.pad_slots, prompt_lengths=layer.prompt_lengths,
                         prompt_width=layer.prompt_width, prompt_slots=layer.prompt_slots)
        self.write_cols: Tensor | None = None
        """Fixed-shape mode (CUDA graphs): the physical columns the next ``update`` writes, on the
        device; ``update`` then returns the whole buffers, whose unwritten columns the caller masks."""

    @property
    def capacity(self) -> int:
        return self._k.shape[2]

    def advance(self, columns: int) -> None:
        """Fixed-shape mode: count ``columns`` more as written (the views and the logical length)."""
        end = self.keys.shape[2] + columns
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if self.write_cols is not None:
            # Shapes never change, so a captured decode step replays with new columns each time.
            self._k.index_copy_(2, self.write_cols, key_states)
            self._v.index_copy_(2, self.write_cols, value_states)
            return self._k, self._v
        start = self.keys.shape[2]
        end = start + key_states.shape[2]
        if end > self.capacity:
            self._k, self._v = _buffer(self.keys, 2 * end), _buffer(self.values, 2 * end)
        self._k[:, :, start:end].copy_(key_states)
        self._v[:, :, start:end].copy_(value_states)
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values

    def reserve(self, columns: int) -> CompressedLayer:
        if self.keys.shape[2] + columns <= self.capacity:
            return self
        return PreallocatedLayer(self, columns)


def _buffer(filled: Tensor, capacity: int) -> Tensor:
    """A (B, H, capacity, d) buffer whose first columns hold ``filled``."""
    bsz, heads, n, dim = filled.shape
    # Zeros, not empty memory: a fixed-shape step attends over unwritten columns with weight 0,
    # and 0 * NaN from stale memory would still poison the output.
    out = filled.new_empty(bsz, heads, capacity, dim)
    out[:, :, :n].copy_(filled)
    out[:, :, n:].zero_()
    return out


class CompressedCache(DynamicCache):
    """A :class:`~transformers.DynamicCache` whose layers are :class:`CompressedLayer` after compression.

    During a prefill its layers are plain dynamic layers; the engine replaces each one with a
    :class:`CompressedLayer` right after that layer's eviction. ``stats`` holds the figures of the
    compression step.
    """

    def __init__(self, layers: list | None = None, stats: CompressionStats | None = None) -> None:
        super().__init__()
        if layers is not None:
            self.layers = list(layers)
        self.stats = stats or CompressionStats()

    def get_query_offset(self, layer_idx: int = 0) -> int:
        """The mask's query offset: the logical length. transformers 5.14+ asks for it (and answers
        the same by itself); older releases read ``get_seq_length`` (:mod:`dapq.compat`)."""
        return self.get_seq_length(layer_idx)

    @property
    def canonical(self) -> bool:
        """True when the logical 2-D attention mask describes every layer (see the module doc)."""
        if not self.layers or not isinstance(self.layers[0], CompressedLayer):
            return True
        if len({layer.prompt_slots for layer in self.layers}) != 1:
            return False
        return all(layer.canonical for layer in self.layers)

    def select(self, rows: Sequence[int]) -> CompressedCache:
        """A new cache made of the given batch rows (repeats allowed), each with its own slots and padding.

        Context-only compression asks many questions of one compressed context this way: one row
        per question, decoded as one batch (:func:`dapq.context.ask`).
        """
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.layers[0].keys.device)
        n_rows = len(self.layers[0].prompt_lengths)
        stats = replace(self.stats, kv_bytes_full=self.stats.kv_bytes_full // max(n_rows, 1) * len(index),
                        budgets=[self.stats.budgets[i] for i in index.tolist()] if self.stats.budgets else [])
        out = CompressedCache([layer.select(index) for layer in self.layers], stats)
        out.stats.kv_bytes_kept = out.kv_bytes()
        return out

    def reserve(self, columns: int) -> None:
        """Give every layer room for ``columns`` appended columns, written in place from now on."""
        self.layers = [layer.reserve(columns) for layer in self.layers]

    def kept_per_layer(self) -> list[int]:
        """Physical prompt slots per KV head, per layer."""
        return [layer.prompt_slots for layer in self.layers]

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
        layers = [CompressedLayer.stack(group) for group in zip(*(c.layers for c in caches), strict=True)]
        stats = replace(caches[0].stats, kv_bytes_full=sum(c.stats.kv_bytes_full for c in caches),
                        kv_bytes_kept=sum(c.stats.kv_bytes_kept for c in caches),
                        budgets=[row for c in caches for row in c.stats.budgets])
        return cls(layers, stats)

    def kv_bytes(self) -> int:
        """Bytes held by keys and values of every layer right now."""
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.layers if layer.is_initialized)


def dynamic_layer(keys: Tensor, values: Tensor) -> DynamicLayer:
    """A plain dynamic layer over existing tensors, without copying them."""
    layer = DynamicLayer()
    layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values
    return layer


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
