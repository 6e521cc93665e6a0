"""Single decode steps over a compressed cache, at the original positions.

The one place that feeds new tokens to a model over a :class:`~dapq.cache.CompressedCache`:
the decode loop of :mod:`dapq.generation`, the questions of :mod:`dapq.context` and DeferKV's
look-ahead steps in :mod:`dapq.compress` all go through :class:`DecodeStepper`. It imports none of
those modules (the state it decodes from lives in the leaf :mod:`dapq.state`), so they form no
import cycle.

Row ``b`` of a batch generates its t-th new token at RoPE position ``Lp_b + t`` whatever was
evicted. The stepper feeds transformers the *logical* attention mask (the prompt's padding mask
plus ones) and lets the cache map it onto the physical slots; for layouts where one 2-D mask
cannot describe every layer (PyramidKV with a padded batch, ratio budgets in a batch) it installs
per-layer masks through forward pre-hooks for its lifetime.
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
        self.tail: Tensor | None = None
        self.n_query = 1

    def _hook(self, module, args, kwargs):
        allowed = self.cache.layers[module.layer_idx].slot_mask(self.tail)  # (B, S)
        if self.impl.startswith("flash"):
            # Flash attention takes a 2-D padding mask and applies causality itself.
            kwargs["attention_mask"] = None if bool(allowed.all()) else allowed.long()
            return args, kwargs
        mask = allowed[:, None, None, :]
        if self.n_query > 1:
            n_slots = allowed.shape[1]
            cols = torch.arange(n_slots, device=allowed.device)
            last = n_slots - self.n_query + torch.arange(self.n_query, device=allowed.device)
            mask = mask & (cols[None, :] <= last[:, None])[None, None]  # (B, 1, Q, S)
        if self.impl == "sdpa":
            kwargs["attention_mask"] = mask
        else:
            dtype = kwargs["hidden_states"].dtype
            additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
            kwargs["attention_mask"] = additive.masked_fill(~mask, torch.finfo(dtype).min)
        return args, kwargs


#: How new columns are stored: ``static`` writes them in place into buffers sized once (kept
#: slots + the steps asked for, :class:`~dapq.cache.PreallocatedLayer`); ``eager`` grows each
#: layer by concatenation, as transformers' ``DynamicLayer`` does (the path of dapq <= 0.1).
DECODE_MODES = ("static", "eager")


def resolve_decode(mode: str | None) -> str:
    """The decode mode to use: ``None``/``"auto"`` is ``static`` on every device (measured faster)."""
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
        if resolve_decode(decode) == "static":
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

    def __enter__(self):
        if self.per_layer is not None:
            self.per_layer.__enter__()
        return self

    def __exit__(self, *exc):
        if self.per_layer is not None:
            self.per_layer.__exit__()

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
        if self.per_layer is not None:
            self.per_layer.tail, self.per_layer.n_query = self.mask[:, self.width : end], n
        out = compat.forward(self.model, tokens, attention_mask=self.mask[:, :end], position_ids=positions,
                             cache=self.cache, first_column=self.columns, logits_to_keep=1)
        self.columns = end
        self.next_position = self.next_position + valid.sum(dim=1)
        return out.logits[:, -1].float()

    def __call__(self, token: Tensor) -> Tensor:
        """One decode step: ``token`` (B,) at each row's next position; the next logits (B, V)."""
        return self.extend(token[:, None])
