"""The compression engine: prefill with per-layer eviction hooks, and post-hoc compression.

Eviction happens *inside* the prefill forward pass, layer by layer: a forward hook on each
attention module runs right after that layer wrote the prompt's K/V to the cache, recomputes the
method's few observation queries from the layer input, scores, and replaces the layer's cache
with the kept slots. Prefill attention itself stays dense (every prompt token sees the full
prompt), the full cache of a layer lives only until its own hook, and scoring adds no second
pass over the model. Hooks are registered per call and always removed; nothing in transformers
is patched.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache

from . import compat
from .cache import CompressedCache, CompressionStats, LayerLayout
from .decoding import DecodeStepper
from .errors import ConfigError, DapqError
from .methods.base import LayerContext, Method
from .methods.full import FullKV
from .models import AttentionHooks, attention_modules, check_supported
from .scoring import project_queries


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


def make_batch(
    model, method: Method, prompts: Sequence[Sequence[int]], *, pad_id: int, tokenizer=None
) -> PromptBatch:
    """Left-pad token-id prompts and append the method's pseudo tokens (DapQ only)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise DapqError("every prompt must have at least one token")
    device = model.device
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    rows, masks, positions = [], [], []
    extra = method.extra_tokens
    for ids in prompts:
        pad = width - len(ids)
        row, mask, pos = [pad_id] * pad + list(ids), [0] * pad + [1] * len(ids), [0] * pad + list(range(len(ids)))
        if extra:
            row += method.pseudo_tokens(
                list(ids), vocab_size=model.config.vocab_size, model_type=model.config.model_type,
                tokenizer=tokenizer, model=model,
            )
            mask += [1] * extra
            pos += method.pseudo_positions(len(ids))
        rows.append(row)
        masks.append(mask)
        positions.append(pos)
    max_pos = max(max(p) for p in positions)
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and max_pos >= limit:
        raise DapqError(
            f"prompt of {width} tokens (+{extra} pseudo) needs position {max_pos}, "
            f"beyond the model's context of {limit}"
        )
    as_long = dict(dtype=torch.long, device=device)
    return PromptBatch(
        input_ids=torch.tensor(rows, **as_long),
        attention_mask=torch.tensor(masks, **as_long),
        position_ids=torch.tensor(positions, **as_long),
        prompt_lengths=torch.tensor(lengths, **as_long),
        width=width,
    )


def select_slots(method: Method, ctx: LayerContext, kept: Tensor, n_slots: int) -> tuple[Tensor, Tensor]:
    """Turn a method's scores into the physical slots of one layer.

    Returns ``(indices, pad_slots)``: ``indices`` (B, Hkv, n_slots) are prompt columns in
    ascending order, preceded in row ``b`` by ``pad_slots[b] = n_slots - kept[b]`` masked slots.
    The always-kept recent window outranks every score; padding never outranks a real token.
    """
    width = ctx.width
    scores = method.score(ctx).float()
    valid = ctx.valid[:, None, :width]
    cols = torch.arange(width, device=scores.device)
    if method.recent:
        # The window counts against the budget; a budget smaller than it keeps its newest part.
        recent = kept.clamp(max=method.recent)
        forced = cols[None, :] >= (width - recent)[:, None]
        scores = scores.masked_fill(forced[:, None, :], float("inf"))
    scores = scores.masked_fill(~valid, float("-inf"))
    # A stable sort instead of topk: max pooling makes plateaus of equal scores, and breaking
    # those ties by column order (earlier first) is what makes a left-padded row select exactly
    # what the same prompt selects alone. topk breaks ties in an unspecified way.
    top = scores.sort(dim=-1, descending=True, stable=True).indices[..., :n_slots]
    rank = torch.arange(n_slots, device=scores.device)
    keep = rank[None, None, :] < kept[:, None, None]
    # Masked slots first (-1), then kept columns in original order: the layout the mask needs.
    order = torch.where(keep, top, torch.full_like(top, -1)).argsort(dim=-1)
    return top.gather(-1, order), n_slots - kept


class _EvictionHooks(AttentionHooks):
    """Forward hooks that score and prune each layer's cache during one forward pass."""

    def __init__(self, model, method: Method, batch: PromptBatch, budgets: Tensor, observer=None):
        super().__init__(model)
        self.method = method
        self.observer = observer
        self.batch = batch
        self.kept = torch.minimum(budgets, batch.prompt_lengths[:, None])  # (B, L)
        self.slots = self.kept.max(dim=0).values.tolist()
        self.valid = batch.attention_mask.bool()
        self.positions = torch.where(self.valid[:, : batch.width], batch.position_ids[:, : batch.width], -1)
        self.layouts: dict[int, LayerLayout] = {}
        self.compress_s = 0.0
        self._sync = model.device.type == "cuda"

    def _hook(self, module, args, kwargs, output):
        if self._sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        self.apply(module, compat.layer_cache(module, kwargs), kwargs["hidden_states"], kwargs["position_embeddings"])
        if self._sync:
            torch.cuda.synchronize()
        self.compress_s += time.perf_counter() - start

    @torch.no_grad()
    def apply(self, attn, cache, hidden_states=None, position_embeddings=None) -> None:
        """Score and prune the cache of ``attn.layer_idx``."""
        layer_idx = attn.layer_idx
        layer = cache.layers[layer_idx]
        width = self.batch.width
        kept = self.kept[:, layer_idx]
        n_slots = self.slots[layer_idx]
        if not self.method.evicts or bool((kept == self.batch.prompt_lengths).all()):
            # Nothing to evict in this layer: only drop the extra (pseudo) tokens.
            layer.keys, layer.values = layer.keys[:, :, :width], layer.values[:, :, :width]
            self.layouts[layer_idx] = LayerLayout(None, width - self.batch.prompt_lengths, width)
            return
        keys = layer.keys
        n_cols = keys.shape[2]
        queries = query_cols = query_valid = None
        n_queries = self.method.num_queries(width)
        if n_queries:
            cos, sin = position_embeddings
            queries = project_queries(attn, hidden_states[:, -n_queries:], cos[:, -n_queries:], sin[:, -n_queries:])
            query_cols = torch.arange(n_cols - n_queries, n_cols, device=keys.device)
            query_valid = self.valid[:, n_cols - n_queries : n_cols]
        ctx = LayerContext(
            layer_idx=layer_idx,
            num_layers=len(self.slots),
            keys=keys,
            queries=queries,
            query_cols=query_cols,
            query_valid=query_valid,
            valid=self.valid[:, :n_cols],
            positions=self.positions,
            prompt_lengths=self.batch.prompt_lengths,
            width=width,
            scaling=attn.scaling,
            model_type=self.model.config.model_type,
        )
        if self.observer is not None:
            self.observer(ctx)  # analyses see exactly what the method scores
        indices, pad_slots = select_slots(self.method, ctx, kept, n_slots)
        gather = indices[..., None].expand(-1, -1, -1, keys.shape[-1])
        layer.keys = keys[:, :, :width].gather(2, gather).contiguous()
        layer.values = layer.values[:, :, :width].gather(2, gather).contiguous()
        self.layouts[layer_idx] = LayerLayout(indices, pad_slots, n_slots)


def _budgets(model, method: Method, batch: PromptBatch) -> Tensor:
    n_layers = model.config.num_hidden_layers
    rows = [method.layer_budgets(int(n), n_layers) for n in batch.prompt_lengths.tolist()]
    return torch.tensor(rows, dtype=torch.long, device=batch.input_ids.device)


def _finish(cache: CompressedCache, hooks: _EvictionHooks, batch: PromptBatch, budgets: Tensor, esize: int):
    n_layers = len(hooks.slots)
    cache.prompt_width = batch.width
    cache.prompt_lengths = batch.prompt_lengths
    cache.layouts = [hooks.layouts[i] for i in range(n_layers)]
    layer0 = cache.layers[0]
    bsz, n_kv, _, head_dim = layer0.keys.shape
    cache.stats.kv_bytes_full = 2 * n_layers * bsz * n_kv * batch.width * head_dim * esize
    cache.stats.kv_bytes_kept = cache.kv_bytes()
    cache.stats.compress_s = hooks.compress_s
    cache.stats.budgets = budgets.tolist()


def _sync(model) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize()


def _run(model, method: Method, batch: PromptBatch, cache: CompressedCache, first: int, observer=None) -> PrefillResult:
    """Forward columns ``[first:]`` of ``batch`` over ``cache`` (which holds ``[:first]``), evicting.

    With ``first = 0`` this is the prefill; :func:`compress` replays only the columns its method
    needs. Logits are kept for the last prompt column (Lp-1) when it is part of the call.
    """
    budgets = _budgets(model, method, batch)
    hooks = _EvictionHooks(model, method, batch, budgets, observer)
    n_cols = batch.input_ids.shape[1]
    last_prompt = batch.width - 1 - first  # index of column Lp-1 within this call
    logits = None
    _sync(model)
    start = time.perf_counter()
    if first == n_cols:
        for attn in attention_modules(model):  # nothing to run: score from the cache alone
            hooks.apply(attn, cache)
    else:
        with hooks:
            out = compat.forward(
                model, batch.input_ids[:, first:], attention_mask=batch.attention_mask,
                position_ids=batch.position_ids[:, first:], cache=cache, first_column=first,
                logits_to_keep=torch.tensor([max(last_prompt, 0)], device=model.device),
            )
        if last_prompt >= 0:
            logits = out.logits[:, -1].float()
    _sync(model)
    total = time.perf_counter() - start
    _finish(cache, hooks, batch, budgets, _esize(model))
    cache.stats.prefill_s = total - hooks.compress_s
    return PrefillResult(cache=cache, logits=logits, batch=batch)


def _lookahead_tokens(model, state: PrefillResult, steps: int) -> Tensor:
    """The first ``steps`` greedy tokens (B, T) of each row over a full cache, left as it was."""
    token = state.logits.argmax(dim=-1)
    tokens = [token]
    if steps > 1:
        widths = [layer.keys.shape[2] for layer in state.cache.layers]
        with DecodeStepper(model, state, steps - 1) as step:
            for _ in range(steps - 1):
                token = step(token).argmax(dim=-1)
                tokens.append(token)
        for layer, width in zip(state.cache.layers, widths, strict=True):
            compat.truncate(layer, width)
    return torch.stack(tokens, dim=1)


def _deferred(model, method: Method, batch: PromptBatch, cache: CompressedCache, logits: Tensor,
              observer=None) -> PrefillResult:
    """Eviction after the first real decoding steps (DeferKV) on a full prompt cache.

    The method's ``lookahead`` greedy tokens are decoded over the full cache, then the prompt's
    last ``prompt_queries`` tokens and those tokens are replayed at their real positions with the
    eviction hooks, exactly as DapQ's pseudo tokens are.
    """
    start = time.perf_counter()
    tokens = _lookahead_tokens(model, PrefillResult(cache, logits, batch), method.lookahead)
    _sync(model)
    lookahead_s = time.perf_counter() - start
    first = batch.width - method.prompt_queries(batch.width)
    out = CompressedCache()
    out.layers = list(cache.layers)
    compat.truncate_cache(out, first)
    state = _run(model, method, batch.with_tokens(tokens), out, first, observer)
    state.stats.prefill_s += lookahead_s
    return PrefillResult(state.cache, logits, batch)


@torch.no_grad()
def prefill(model, method: Method, batch: PromptBatch, *, observer=None) -> PrefillResult:
    """Prefill ``batch`` once, evicting layer by layer; return the cache and first-token logits.

    For DapQ the batch already carries the pseudo tokens; the logits are taken at the last
    *prompt* column (position Lp-1), which causality makes identical to a plain prefill.
    ``observer(ctx)``, if given, sees each layer's :class:`LayerContext` before selection.
    Methods with a ``lookahead`` (DeferKV) prefill without eviction, then evict once their
    decoding steps have run.
    """
    check_supported(model)
    if method.lookahead and method.evicts:
        plain = _run(model, _NO_EVICTION, batch, CompressedCache(), first=0)
        state = _deferred(model, method, batch, plain.cache, plain.logits, observer)
        state.stats.prefill_s += plain.stats.prefill_s
        return state
    return _run(model, method, batch, CompressedCache(), first=0, observer=observer)


@torch.no_grad()
def compress(
    model,
    cache: DynamicCache,
    method: Method,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    tokenizer=None,
    observer=None,
) -> PrefillResult:
    """Compress a cache that someone else's loop already prefilled over ``input_ids``.

    The cache is consumed (its layers move into the returned :class:`CompressedCache`). Only the
    queries the method needs are replayed, so the cost matches scoring inside the prefill:

    - ``streamingllm``, ``lacache``, ``random``, ``full``: no forward pass at all;
    - ``dapq``: one forward of the N pseudo tokens on top of the full cache;
    - ``snapkv``, ``pyramidkv``: the last W prompt tokens are cropped and re-run;
    - ``dapq_hybrid``: the last W prompt tokens and the N pseudo tokens;
    - ``deferkv``: the last prompt token (for the first token), T-1 decode steps, then the last
      W prompt tokens and the T decoded tokens;
    - ``h2o``: needs every prompt query, so the prompt is re-run.

    ``logits`` of the result are the next-token logits when prompt tokens were re-run, else None
    (the caller has them from its own prefill). ``input_ids`` must be left-padded.
    """
    check_supported(model)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    width = input_ids.shape[1]
    if cache.get_seq_length() != width:
        raise DapqError(f"the cache holds {cache.get_seq_length()} tokens but input_ids has {width} columns")
    mask = attention_mask.bool()
    if bool((mask[:, 1:].long() - mask[:, :-1].long() < 0).any()):
        raise ConfigError("compress() needs left-padded input_ids (padding before each prompt)")
    prompts = [row[m].tolist() for row, m in zip(input_ids, mask, strict=True)]
    pad_id = int(input_ids[~mask][0]) if bool((~mask).any()) else 0
    batch = make_batch(model, method, prompts, pad_id=pad_id, tokenizer=tokenizer)
    out_cache = CompressedCache()
    out_cache.layers = list(cache.layers)
    if method.lookahead and method.evicts:
        # Replay the last prompt token for the first-token logits, then decode and evict.
        compat.truncate_cache(out_cache, width - 1)
        plain = _run(model, _NO_EVICTION, batch, out_cache, width - 1)
        return _deferred(model, method, batch, plain.cache, plain.logits, observer)
    if not method.evicts or method.num_queries(width) == 0:
        first = batch.input_ids.shape[1]  # nothing to replay: score from the cache alone
    else:
        # Re-run the prompt tokens whose queries the method observes (none for DapQ, the last W
        # for SnapKV, all of them for H2O), then its extra tokens, on top of the rest.
        first = width - method.prompt_queries(width)
        compat.truncate_cache(out_cache, first)
    return _run(model, method, batch, out_cache, first, observer)


_NO_EVICTION = FullKV()


def _esize(model) -> int:
    return torch.finfo(model.dtype).bits // 8
