"""Ground truth for the analyses: the real decoding queries of FullKV and their attention.

:func:`trace_decode` decodes T greedy tokens with the full cache and records, at every layer,
the queries of the fed tokens (before and after RoPE) and each query's softmax attention over the
prompt keys (normalized, as in the real decode, over prompt plus already generated keys).
:func:`capture_pseudo_queries` records the pseudo queries a DapQ prefill computes. Both use the
scoring toolkit's own query projection, so the analyses measure exactly what the methods use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache

from .. import compat
from ..cache import clone_cache
from ..compress import make_batch
from ..models import AttentionHooks
from ..scoring import apply_rope, attention_probs, prerope_queries


@dataclass
class DecodeTrace:
    """T FullKV greedy decoding steps of one prompt."""

    prompt_len: int
    tokens: list[int]
    """The T tokens fed at positions Lp .. Lp+T-1 (the greedy continuation)."""
    queries_pre: Tensor
    """(L, Hq, T, d) queries before RoPE."""
    queries_post: Tensor
    """(L, Hq, T, d) queries after RoPE."""
    attention: Tensor
    """(L, Hq, T, Lp) softmax attention of each decode query over the prompt keys."""


class _QueryRecorder(AttentionHooks):
    """Forward hooks that keep the (pre-RoPE, post-RoPE) queries of the last ``n`` columns."""

    def __init__(self, model, n: int, with_attention: bool = False, prompt_len: int = 0):
        super().__init__(model)
        self.n, self.with_attention, self.prompt_len = n, with_attention, prompt_len
        self.pre: dict[int, list[Tensor]] = {}
        self.post: dict[int, list[Tensor]] = {}
        self.attn: dict[int, list[Tensor]] = {}

    def _hook(self, module, args, kwargs, output):
        hs = kwargs["hidden_states"][:, -self.n :]
        cos, sin = kwargs["position_embeddings"]
        pre = prerope_queries(module, hs)
        post = apply_rope(pre, cos[:, -self.n :], sin[:, -self.n :])
        i = module.layer_idx
        self.pre.setdefault(i, []).append(pre[0].float())
        self.post.setdefault(i, []).append(post[0].float())
        if self.with_attention:
            keys = compat.layer_cache(module, kwargs).layers[i].keys
            probs = attention_probs(post, keys, module.scaling)[0]
            self.attn.setdefault(i, []).append(probs[..., : self.prompt_len])

    def stacked(self, store: dict[int, list[Tensor]]) -> Tensor:
        return torch.stack([torch.cat(store[i], dim=1) for i in sorted(store)])


def _forward(model, cache: DynamicCache, token_ids: list[int], start: int):
    """Forward ``token_ids`` of one unpadded prompt at positions ``start..`` over ``cache``."""
    ids = torch.tensor([token_ids], device=model.device)
    positions = torch.arange(start, start + len(token_ids), device=model.device)[None]
    return compat.forward(model, ids, position_ids=positions, cache=cache, first_column=start, logits_to_keep=1)


@torch.no_grad()
def prompt_cache(model, prompt_ids: list[int]) -> DynamicCache:
    """A plain FullKV prefill of one prompt (shared by the analyses, cloned before mutation)."""
    cache = DynamicCache()
    _forward(model, cache, prompt_ids, 0)
    return cache


@torch.no_grad()
def trace_decode(model, prompt_ids: list[int], steps: int, cache: DynamicCache | None = None) -> DecodeTrace:
    """Greedy-decode ``steps`` tokens with FullKV and record the real decoding queries."""
    lp = len(prompt_ids)
    cache = clone_cache(cache) if cache is not None else DynamicCache()
    if cache.get_seq_length() == 0:
        _forward(model, cache, prompt_ids[:-1], 0)
    else:
        compat.truncate_cache(cache, lp - 1)
    # Re-run the last prompt token so its logits give the first new token.
    token = int(_forward(model, cache, prompt_ids[-1:], lp - 1).logits[0, -1].argmax())
    tokens = []
    with _QueryRecorder(model, 1, with_attention=True, prompt_len=lp) as rec:
        for t in range(steps):
            tokens.append(token)
            token = int(_forward(model, cache, [token], lp + t).logits[0, -1].argmax())
    return DecodeTrace(lp, tokens, rec.stacked(rec.pre), rec.stacked(rec.post), rec.stacked(rec.attn))


@torch.no_grad()
def queries_at(model, cache: DynamicCache, lp: int, token_ids: list[int], positions: list[int]) -> tuple[Tensor, Tensor]:
    """(pre-RoPE, post-RoPE) queries (L, Hq, n, d) of ``token_ids`` placed after the cached prompt.

    The tokens are appended physically after the ``lp`` prompt tokens of a full (uncompressed)
    cache with the given RoPE positions (the way DapQ's pseudo tokens are), then the cache is
    cropped back to ``lp``, so one prompt prefill serves many conditions at the cost of an n-token
    forward each. ``lp`` is explicit: a cache's reported length is not its physical width (a
    ``CompressedCache`` reports the logical one).
    """
    n = len(token_ids)
    with _QueryRecorder(model, n) as rec:
        compat.forward(model, torch.tensor([token_ids], device=model.device), cache=cache, first_column=lp,
                       position_ids=torch.tensor([positions], device=model.device), logits_to_keep=1)
    compat.truncate_cache(cache, lp)
    return rec.stacked(rec.pre), rec.stacked(rec.post)


@torch.no_grad()
def capture_pseudo_queries(model, prompt_ids: list[int], method, tokenizer=None) -> tuple[Tensor, Tensor]:
    """The (pre-RoPE, post-RoPE) pseudo queries (L, Hq, N, d) of a DapQ-style prefill."""
    batch = make_batch(model, method, [prompt_ids], pad_id=0, tokenizer=tokenizer)
    with _QueryRecorder(model, batch.extra) as rec:
        compat.forward(model, batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                       cache=DynamicCache(), first_column=0, logits_to_keep=1)
    return rec.stacked(rec.pre), rec.stacked(rec.post)
