"""Single decode steps over a compressed cache, at the original positions.

The one place that feeds new tokens to a model over a :class:`~dapq.cache.CompressedCache`:
the decode loop of :mod:`dapq.generation`, the questions of :mod:`dapq.context` and DeferKV's
look-ahead steps in :mod:`dapq.compress` all go through :class:`DecodeStepper`. It imports none of
those modules (the state it decodes from lives in the leaf :mod:`dapq.state`), so they form no
import cycle.

Row ``b`` of a batch generates its t-th new token at RoPE position ``Lp_b + t`` whatever was
evicted. The stepper feeds transformers the *logical* attention mask (the prompt's padding mask
plus ones) and lets the cache map it onto the physical slots; for layouts where one 2-D mask
cannot describe every layer (PyramidKV with a padded batch, ratio budgets in a batch, head-wise
budgets) it installs per-layer masks through forward pre-hooks for its lifetime.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import compat
from .cache import CompressedCache
from .errors import ConfigError
from .models import AttentionHooks
from .state import PrefillResult


class _PerLayerMasks(AttentionHooks):
    """Forward pre-hooks that hand each attention layer its own mask (non-canonical layouts).

    ``tail`` marks which columns appended after the prompt slots are real, ``n_query`` how many of
    them the current forward feeds (causal among themselves).
    """

    pre = True

    def __init__(self, model, cache: CompressedCache):
        super().__init__(model)
        self.cache = cache
        self.impl = model.config._attn_implementation
        self.group = _check_head_masks(model, cache, self.impl)
        self.tail: Tensor | None = None
        self.n_query = 1

    def _hook(self, module, args, kwargs):
        allowed = self.cache.layers[module.layer_idx].slot_mask(self.tail)  # (B, S) or (B, Hkv, S)
        if self.impl.startswith("flash"):
            # Flash attention takes a 2-D padding mask and applies causality itself.
            kwargs["attention_mask"] = None if bool(allowed.all()) else allowed.long()
            return args, kwargs
        mask = _head_mask(allowed, self.group)
        if self.n_query > 1:
            n_slots = allowed.shape[-1]
            cols = torch.arange(n_slots, device=allowed.device)
            last = n_slots - self.n_query + torch.arange(self.n_query, device=allowed.device)
            mask = mask & (cols[None, :] <= last[:, None])[None, None]  # (B, 1 or Hq, Q, S)
        if self.impl == "sdpa":
            kwargs["attention_mask"] = mask
        else:
            dtype = kwargs["hidden_states"].dtype
            additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
            kwargs["attention_mask"] = additive.masked_fill(~mask, torch.finfo(dtype).min)
        return args, kwargs


def _check_head_masks(model, cache: CompressedCache, impl: str) -> int:
    """Query heads per KV head, checked to be servable when a layer's heads keep different counts.

    A head-wise layer's mask has one row of slots per query head: the KV head's slots repeated for
    each query head that reads it (grouped-query attention). Flash attention takes no such mask.
    """
    if any(layer.head_wise for layer in cache.layers) and impl.startswith("flash"):
        raise ConfigError("head_budget='adaptive' needs attention sdpa or eager (flash attention takes no per-head mask)")
    config = model.config.get_text_config()
    return config.num_attention_heads // (getattr(config, "num_key_value_heads", None) or config.num_attention_heads)


def _head_mask(allowed: Tensor, group: int) -> Tensor:
    """(B, 1, 1, S) from a layer's (B, S) slot mask, or (B, Hq, 1, S) from a head-wise (B, Hkv, S) one."""
    if allowed.dim() == 2:
        return allowed[:, None, None, :]
    return allowed.repeat_interleave(group, dim=1)[:, :, None, :]


class _FixedShapeMasks(AttentionHooks):
    """Forward pre-hooks for fixed-shape decoding: every layer attends over its whole buffer.

    Each layer keeps a (B, 1, 1, capacity) bool buffer of the slots written so far; the hook marks
    the columns the current forward writes (``write_cols``, on the device) with their validity and
    hands the layer that buffer, made causal within the block. Only device operations on tensors
    that live as long as the stepper: a CUDA graph captured through these hooks replays correctly
    for every later step.
    """

    pre = True

    def __init__(self, model, cache: CompressedCache, step: Tensor):
        super().__init__(model)
        self.impl = model.config._attn_implementation
        if self.impl.startswith("flash"):
            raise ConfigError("decode='graph' needs attention sdpa or eager (flash attention takes no slot mask)")
        group = _check_head_masks(model, cache, self.impl)
        self.step, self.layers = step, cache.layers
        self.block: Tensor | None = None  # (B, T): which tokens of the block are real
        self.slots, self.cols = [], []
        for layer in self.layers:
            tail = torch.zeros(layer.pad_slots.shape[0], layer.capacity - layer.prompt_slots, dtype=torch.bool,
                               device=layer.pad_slots.device)
            self.slots.append(_head_mask(layer.slot_mask(tail), group).clone())
            self.cols.append(torch.arange(layer.capacity, device=layer.pad_slots.device))

    def _hook(self, module, args, kwargs):
        idx = module.layer_idx
        layer, slots = self.layers[idx], self.slots[idx]
        layer.write_cols = layer.prompt_slots + self.step  # (T,) physical columns of this block
        slots.index_copy_(3, layer.write_cols, self.block[:, None, None, :].expand(-1, slots.shape[1], -1, -1))
        mask = slots & (self.cols[idx][None, :] <= layer.write_cols[:, None])[None, None]  # (B, 1 or Hq, T, S)
        if self.impl == "sdpa":
            kwargs["attention_mask"] = mask
        else:
            dtype = kwargs["hidden_states"].dtype
            kwargs["attention_mask"] = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
                ~mask, torch.finfo(dtype).min)
        return args, kwargs


#: How new columns are stored: ``static`` writes them in place into buffers sized once (kept
#: slots + the steps asked for, :class:`~dapq.cache.PreallocatedLayer`); ``graph`` does the same
#: with shapes that never change (each layer attends over its whole buffer, masked), and on CUDA
#: captures the one-token step as a CUDA graph replayed at every step; ``eager`` grows each layer
#: by concatenation, as transformers' ``DynamicLayer`` does (the path of dapq <= 0.1).
DECODE_MODES = ("static", "graph", "eager")


def resolve_decode(mode: str | None) -> str:
    """The decode mode to use: ``None``/``"auto"`` is ``static`` on every device.

    ``graph`` is not the default on CUDA yet: its speed has not been measured on a GPU
    (``scripts/gpu-check.sh`` does).
    """
    if mode in (None, "auto"):
        return "static"
    if mode not in DECODE_MODES:
        raise ConfigError(f"decode must be one of auto, {', '.join(DECODE_MODES)}, got {mode!r}")
    return mode


class DecodeStepper:
    """Feeds new tokens over a compressed cache at their original positions.

    Row ``b`` continues at position ``Lp_b``: its t-th fed token sits at ``Lp_b + t`` whatever was
    evicted. :meth:`extend` feeds a block of tokens per row (a question, where rows of different
    lengths are left-padded inside the block), calling it with a token per row feeds one step. Used by
    :func:`~dapq.generation.decode`, by context-only compression (:mod:`dapq.context`), by
    DeferKV's lookahead and by the tests' teacher forcing. Use as a context manager: for
    non-canonical layouts it installs per-layer masks for its lifetime.

    Parameters
    ----------
    model, state
        The model and a compressed state (cache, batch).
    max_steps : int
        Columns to reserve in the logical mask and, with ``decode="static"``, in every layer's
        buffers (both grow if more are fed).
    decode : {"auto", "static", "eager"}
        How new columns are stored (:data:`DECODE_MODES`).
    """

    def __init__(self, model, state: PrefillResult, max_steps: int = 0, decode: str | None = "auto"):
        self.model = model
        self.cache = state.cache
        self.mode = resolve_decode(decode)
        if self.mode != "eager":
            self.cache.reserve(max_steps)
        batch = state.batch
        self.width = batch.width
        self.columns = batch.width  # logical columns the cache holds
        self.next_position = batch.prompt_lengths.clone()
        prompt_mask = batch.attention_mask[:, : batch.width]
        room = torch.ones(prompt_mask.shape[0], max_steps + 1, dtype=prompt_mask.dtype, device=prompt_mask.device)
        # The logical 2-D mask of every column so far, with room to grow: no copy per step.
        self.mask = torch.cat([prompt_mask, room], dim=1)
        self.per_layer = None if self.cache.canonical else _PerLayerMasks(model, self.cache)
        self.fixed = None
        if self.mode == "graph":
            self.fixed = _FixedShape(model, self.cache, batch.prompt_lengths.shape[0], max_steps)
            self.per_layer = self.fixed.masks

    def __enter__(self):
        if self.per_layer is not None:
            self.per_layer.__enter__()
        return self

    def __exit__(self, *exc):
        if self.per_layer is not None:
            self.per_layer.__exit__()

    def _forward(self, tokens: Tensor, positions: Tensor, end: int, valid: Tensor):
        if self.fixed is not None:
            return self.fixed.forward(tokens, positions, valid, self.columns)
        if self.per_layer is not None:
            self.per_layer.tail, self.per_layer.n_query = self.mask[:, self.width : end], tokens.shape[1]
        return compat.forward(self.model, tokens, attention_mask=self.mask[:, :end], position_ids=positions,
                              cache=self.cache, first_column=self.columns, logits_to_keep=1).logits[:, -1]

    @torch.no_grad()
    def extend(self, tokens: Tensor, valid: Tensor | None = None) -> Tensor:
        """Feed ``tokens`` (B, T); return the float logits (B, V) after the last column.

        ``valid`` (B, T) is False at padding inside the block; padding must lead each row, so the
        last column is real for every row. Real tokens take the next positions of their row.
        """
        n = tokens.shape[1]
        valid = torch.ones_like(tokens) if valid is None else valid.to(dtype=self.mask.dtype)
        end = self.columns + n
        if end > self.mask.shape[1]:
            grow = torch.ones(self.mask.shape[0], end - self.mask.shape[1] + 64, dtype=self.mask.dtype,
                              device=self.mask.device)
            self.mask = torch.cat([self.mask, grow], dim=1)
        self.mask[:, self.columns : end] = valid
        positions = self.next_position[:, None] + (valid.cumsum(dim=1) - 1).clamp(min=0)
        logits = self._forward(tokens, positions, end, valid)
        self.columns = end
        self.next_position = self.next_position + valid.sum(dim=1)
        return logits.float()

    def __call__(self, token: Tensor) -> Tensor:
        """One decode step: ``token`` (B,) at each row's next position; the next logits (B, V)."""
        return self.extend(token[:, None])


class _FixedShape:
    """The fixed-shape decode of ``decode="graph"``: static buffers, and on CUDA one captured graph.

    Every input of a forward lives in a buffer that outlives it (token ids, positions, the step
    counter that says which columns to write, each layer's slot mask), so the one-token step can
    be captured once as a CUDA graph and replayed: no Python, no kernel launches, no allocation
    per step. Multi-token blocks (a question) and every step on the CPU run the same fixed-shape
    forward without capture, which is what the CPU tests check against the other modes.
    """

    def __init__(self, model, cache: CompressedCache, rows: int, max_steps: int):
        self.model, self.cache, self.room = model, cache, max_steps
        device = model.device
        # The step counter and block flags the captured graph reads: they must live as long as it.
        self.graph_step = torch.zeros(1, dtype=torch.long, device=device)
        self.graph_block = torch.ones(rows, 1, dtype=torch.bool, device=device)
        self.masks = _FixedShapeMasks(model, cache, self.graph_step)
        self.ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.capture = device.type == "cuda"
        self.graph = self.logits = None
        self.written = 0

    def _run(self, tokens, positions, first_column: int):
        return compat.forward(self.model, tokens, attention_mask=None, position_ids=positions, cache=self.cache,
                              first_column=first_column, logits_to_keep=1).logits[:, -1]

    def forward(self, tokens: Tensor, positions: Tensor, valid: Tensor, first_column: int) -> Tensor:
        n = tokens.shape[1]
        if self.written + n > self.room:
            raise ValueError(f"decode='graph' reserved {self.room} columns; {self.written + n} were fed")
        if n > 1 or not self.capture:
            self.masks.step = torch.arange(self.written, self.written + n, device=tokens.device)
            self.masks.block = valid.bool()
            logits = self._run(tokens, positions, first_column)
        else:
            logits = self._replay(tokens, positions, first_column)
        self.written += n
        for layer in self.cache.layers:
            layer.advance(n)
            layer.write_cols = None
        return logits

    def _replay(self, tokens: Tensor, positions: Tensor, first_column: int) -> Tensor:
        self.ids.copy_(tokens)
        self.positions.copy_(positions)
        self.graph_step.fill_(self.written)
        if self.graph is None:
            self.masks.step, self.masks.block = self.graph_step, self.graph_block
            # Warm up on a side stream (allocator and kernel choices settle), then capture. Each run
            # writes the same column with the same values, so repeating the step is harmless.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._run(self.ids, self.positions, first_column)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = self._run(self.ids, self.positions, first_column)
        self.graph.replay()
        return self.logits.clone()
