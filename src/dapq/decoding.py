"""Single decode steps over a compressed cache, at the original positions.

The one place that feeds new tokens to a model over a :class:`~dapq.cache.CompressedCache`:
the decode loop of :mod:`dapq.generation`, DeferKV's lookahead steps in :mod:`dapq.compress`
and the analyses' teacher forcing all go through :class:`DecodeStepper`. It imports neither of
those modules, which is what keeps them free of an import cycle.

Row ``b`` of a batch generates its t-th new token at RoPE position ``Lp_b + t`` whatever was
evicted. The stepper feeds transformers the *logical* attention mask (the prompt's padding mask
plus ones) and lets the cache map it onto the physical slots; for layouts where one 2-D mask
cannot describe every layer (PyramidKV with a padded batch, ratio budgets in a batch) it installs
per-layer masks through forward pre-hooks for its lifetime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from . import compat
from .cache import CompressedCache
from .models import AttentionHooks

if TYPE_CHECKING:
    from .compress import PrefillResult


class _PerLayerMasks(AttentionHooks):
    """Forward pre-hooks that hand each attention layer its own mask (non-canonical layouts)."""

    pre = True

    def __init__(self, model, cache: CompressedCache):
        super().__init__(model)
        self.cache = cache
        self.impl = model.config._attn_implementation
        self.n_new = 0

    def _hook(self, module, args, kwargs):
        mask = self.cache.slot_mask(module.layer_idx, self.n_new)
        if self.impl.startswith("flash"):
            kwargs["attention_mask"] = None if bool(mask.all()) else mask.long()
        elif self.impl == "sdpa":
            kwargs["attention_mask"] = mask[:, None, None, :]
        else:
            dtype = kwargs["hidden_states"].dtype
            additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
            kwargs["attention_mask"] = additive.masked_fill(~mask, torch.finfo(dtype).min)[:, None, None, :]
        return args, kwargs


class DecodeStepper:
    """Runs single decode steps over a compressed cache at the original positions.

    Step ``t`` feeds one token per row at position ``Lp_b + t`` and returns the next logits.
    Used by :func:`decode`, and by analyses that teacher-force tokens. Use as a context manager:
    for non-canonical layouts it installs per-layer masks for its lifetime.
    """

    def __init__(self, model, state: PrefillResult, max_steps: int):
        self.model = model
        self.cache = state.cache
        self.batch = state.batch
        bsz, width = self.batch.input_ids.shape[0], self.batch.width
        prompt_mask = self.batch.attention_mask[:, :width]
        ones = torch.ones(bsz, max_steps + 1, dtype=prompt_mask.dtype, device=prompt_mask.device)
        self.mask = torch.cat([prompt_mask, ones], dim=1)
        self.per_layer = None if self.cache.canonical else _PerLayerMasks(model, self.cache)

    def __enter__(self):
        if self.per_layer is not None:
            self.per_layer.__enter__()
        return self

    def __exit__(self, *exc):
        if self.per_layer is not None:
            self.per_layer.__exit__()

    @torch.no_grad()
    def __call__(self, token: Tensor, step: int) -> Tensor:
        width = self.batch.width
        if self.per_layer is not None:
            self.per_layer.n_new = step + 1
        out = compat.forward(
            self.model, token[:, None], attention_mask=self.mask[:, : width + step + 1],
            position_ids=(self.batch.prompt_lengths + step)[:, None], cache=self.cache, first_column=width + step,
        )
        return out.logits[:, -1].float()
