"""The compression engine: prefill with per-layer eviction hooks, and post-hoc compression.

Eviction happens *inside* the prefill forward pass, layer by layer: a forward hook on each
attention module runs right after that layer wrote the prompt's K/V to the cache, recomputes the
method's few observation queries from the layer input, scores, and replaces the layer's cache
with the kept slots. Prefill attention itself stays dense (every prompt token sees the full
prompt), the full cache of a layer lives only until its own hook, and scoring adds no second
pass over the model. Hooks are registered per call and always removed; nothing in transformers
is patched.

What a method needs is read from its :class:`~dapq.methods.base.Observation` alone (the prompt
tail, pseudo tokens with their positions, look-ahead steps, recent tokens kept), so a method with
a new scoring rule needs no change here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import Tensor
from transformers import DynamicCache

from . import compat
from .cache import CompressedCache, CompressedLayer, dynamic_layer
from .decoding import DecodeStepper
from .errors import ConfigError, DapqError
from .methods.base import LayerContext, Method
from .methods.budgets import head_counts
from .methods.full import FullKV
from .models import AttentionHooks, attention_modules, check_supported
from .scoring import project_queries
from .state import PrefillResult, PromptBatch


def make_batch(
    model, method: Method, prompts: Sequence[Sequence[int]], *, pad_id: int, tokenizer=None
) -> PromptBatch:
    """Left-pad token-id prompts and append the method's pseudo tokens (its ``Observation.pseudo_tokens``)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise DapqError("every prompt must have at least one token")
    device = model.device
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    rows, masks, positions = [], [], []
    observation = method.observation()
    extra = observation.pseudo_tokens
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
    # Look-ahead steps (DeferKV) are decoded at the positions after the prompt: they need room too.
    max_pos = max(max(p) for p in positions) + observation.lookahead_steps
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and observation.keep_recent > limit:
        # A recent window longer than any prompt the model takes is a typo, not a setting.
        raise DapqError(f"keep_recent={observation.keep_recent} exceeds the model's context of {limit}")
    if limit is not None and max_pos >= limit:
        added = f"{extra} pseudo" if extra else f"{observation.lookahead_steps} look-ahead steps"
        raise DapqError(f"prompt of {width} tokens (+{added}) needs position {max_pos}, "
                        f"beyond the model's context of {limit}")
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
    The always-kept recent tokens outrank every score; padding never outranks a real token.

    With ``method.head_budget == "adaptive"`` the heads keep different counts
    (:func:`~dapq.methods.budgets.head_counts`, the same total): ``n_slots`` becomes the largest
    count and ``pad_slots`` is (B, Hkv), each head's masked slots.
    """
    width = ctx.width
    scores = method.score(ctx).float()
    valid = ctx.valid[:, None, :width]
    cols = torch.arange(width, device=scores.device)
    keep_recent = method.observation().keep_recent
    if keep_recent:
        # The recent tokens count against the budget; a budget smaller than them keeps their newest part.
        recent = kept.clamp(max=keep_recent)
        forced = cols[None, :] >= (width - recent)[:, None]
        scores = scores.masked_fill(forced[:, None, :], float("inf"))
    scores = scores.masked_fill(~valid, float("-inf"))
    if method.head_budget == "adaptive":
        counts, top = head_counts(scores, kept, method.head_floor)
        n_slots = int(counts.max())  # one host sync per layer: the slot count sizes the layer
        top, pad_slots = top[..., :n_slots], n_slots - counts
    else:
        # A stable sort instead of topk: max pooling makes plateaus of equal scores, and breaking
        # those ties by column order (earlier first) is what makes a left-padded row select exactly
        # what the same prompt selects alone. topk breaks ties in an unspecified way.
        top = scores.sort(dim=-1, descending=True, stable=True).indices[..., :n_slots]
        counts, pad_slots = kept[:, None], n_slots - kept
    rank = torch.arange(n_slots, device=scores.device)
    keep = rank[None, None, :] < counts[..., None]
    # Masked slots first (-1), then kept columns in original order: the layout the mask needs.
    order = torch.where(keep, top, torch.full_like(top, -1)).argsort(dim=-1)
    return top.gather(-1, order), pad_slots


def gather_slots(keys: Tensor, values: Tensor, width: int, indices: Tensor) -> tuple[Tensor, Tensor]:
    """The keys and values (B, Hkv, C, d) of the kept prompt columns ``indices`` (B, Hkv, C)."""
    gather = indices[..., None].expand(-1, -1, -1, keys.shape[-1])
    return keys[:, :, :width].gather(2, gather), values[:, :, :width].gather(2, gather)


class _EvictionHooks(AttentionHooks):
    """Forward hooks that score and prune each layer's cache during one forward pass."""

    def __init__(self, model, method: Method, batch: PromptBatch, budgets: Tensor, observer=None):
        super().__init__(model)
        self.method = method
        self.observation = method.observation()
        self.observer = observer
        self.batch = batch
        self.kept = torch.minimum(budgets, batch.prompt_lengths[:, None])  # (B, L)
        self.slots = self.kept.max(dim=0).values.tolist()
        self.valid = batch.attention_mask.bool()
        self.positions = torch.where(self.valid[:, : batch.width], batch.position_ids[:, : batch.width], -1)
        # Decided once per forward, on the host, so that no layer waits on the device for them.
        self.padded = not bool(self.valid.all())
        self.whole = (self.kept == batch.prompt_lengths[:, None]).all(dim=0).tolist()  # (L,) nothing to evict
        self.timer = _StepTimer(model.device)
        # A layer-invariant method's selection, per (kept counts, slots): layers that share a
        # budget share it (one selection per forward; an observer still sees every layer).
        self.selections: dict[tuple, tuple[Tensor, Tensor]] | None = (
            {} if method.layer_invariant and observer is None else None)
        self.kept_host = self.kept.T.tolist() if self.selections is not None else None

    @property
    def compress_s(self) -> float:
        return self.timer.seconds()

    def _hook(self, module, args, kwargs, output):
        with self.timer:
            self.apply(module, compat.layer_cache(module, kwargs), kwargs["hidden_states"],
                       kwargs["position_embeddings"])

    def context(self, attn, keys: Tensor, hidden_states, position_embeddings) -> LayerContext:
        """The :class:`LayerContext` of one layer: its keys and the method's observation queries."""
        width = self.batch.width
        n_cols = keys.shape[2]
        n_queries = self.observation.queries(width)
        queries = query_cols = query_valid = None
        if n_queries:
            cos, sin = position_embeddings
            queries = project_queries(attn, hidden_states[:, -n_queries:], cos[:, -n_queries:], sin[:, -n_queries:])
            query_cols = range(n_cols - n_queries, n_cols)
            query_valid = self.valid[:, n_cols - n_queries : n_cols]
        return LayerContext(
            layer_idx=attn.layer_idx, num_layers=len(self.slots), keys=keys, queries=queries, query_cols=query_cols,
            query_valid=query_valid, valid=self.valid[:, :n_cols], positions=self.positions,
            prompt_lengths=self.batch.prompt_lengths, width=width, scaling=attn.scaling,
            model_type=self.model.config.model_type, n_tail=self.observation.tail(width), padded=self.padded,
        )

    @torch.no_grad()
    def apply(self, attn, cache, hidden_states=None, position_embeddings=None) -> None:
        """Score and prune the cache of ``attn.layer_idx``: the layer becomes a :class:`CompressedLayer`."""
        layer_idx = attn.layer_idx
        layer = cache.layers[layer_idx]
        width, lengths = self.batch.width, self.batch.prompt_lengths
        kept = self.kept[:, layer_idx]
        if not self.method.evicts or self.whole[layer_idx]:
            # Nothing to evict in this layer: only drop the extra (pseudo) columns.
            cache.layers[layer_idx] = CompressedLayer.whole(layer.keys[:, :, :width], layer.values[:, :, :width],
                                                            lengths)
            return
        shared = None if self.selections is None else (tuple(self.kept_host[layer_idx]), self.slots[layer_idx])
        if shared in (self.selections or {}):
            indices, pad_slots = self.selections[shared]
        else:
            ctx = self.context(attn, layer.keys, hidden_states, position_embeddings)
            if self.observer is not None:
                self.observer(ctx)  # analyses see exactly what the method scores
            indices, pad_slots = select_slots(self.method, ctx, kept, self.slots[layer_idx])
            if shared is not None:
                self.selections[shared] = indices, pad_slots
        keys, values = gather_slots(layer.keys, layer.values, width, indices)
        cache.layers[layer_idx] = CompressedLayer(keys, values, kept_indices=indices, pad_slots=pad_slots,
                                                  prompt_lengths=lengths, prompt_width=width)


class _StepTimer:
    """Seconds spent inside ``with`` blocks. On CUDA it records events instead of synchronizing, so
    timing the per-layer compression does not stall the prefill it runs in; the one sync happens
    when :meth:`seconds` is read, after the forward."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.events: list = []
        self.total = 0.0

    def __enter__(self):
        if self.cuda:
            self.events.append(torch.cuda.Event(enable_timing=True))
            self.events[-1].record()
        else:
            self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.events.append(torch.cuda.Event(enable_timing=True))
            self.events[-1].record()
        else:
            self.total += time.perf_counter() - self._start

    def seconds(self) -> float:
        if self.cuda and self.events:
            self.events[-1].synchronize()
            self.total += sum(a.elapsed_time(b) for a, b in zip(self.events[::2], self.events[1::2], strict=True)) / 1e3
            self.events = []
        return self.total


def _budgets(model, method: Method, batch: PromptBatch) -> Tensor:
    n_layers = model.config.num_hidden_layers
    rows = [method.layer_budgets(int(n), n_layers) for n in batch.prompt_lengths.tolist()]
    return torch.tensor(rows, dtype=torch.long, device=batch.input_ids.device)


def _record(cache: CompressedCache, hooks: _EvictionHooks, batch: PromptBatch, budgets: Tensor, esize: int) -> None:
    """The figures of the compression step, on the cache it made."""
    bsz, n_kv, _, head_dim = cache.layers[0].keys.shape
    cache.stats.kv_bytes_full = 2 * len(cache.layers) * bsz * n_kv * batch.width * head_dim * esize
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
    _record(cache, hooks, batch, budgets, _esize(model))
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


def _prefix(cache, length: int) -> CompressedCache:
    """A cache of plain layers holding the first ``length`` columns of ``cache`` (no copy)."""
    return CompressedCache([dynamic_layer(layer.keys[:, :, :length], layer.values[:, :, :length])
                            for layer in cache.layers])


def _deferred(model, method: Method, batch: PromptBatch, cache: CompressedCache, logits: Tensor,
              observer=None) -> PrefillResult:
    """Eviction after the first real decoding steps (DeferKV) on a full prompt cache.

    The method's look-ahead greedy tokens are decoded over the full cache, then the prompt's
    tail and those tokens are replayed at their real positions with the eviction hooks, exactly
    as DapQ's pseudo tokens are.
    """
    observation = method.observation()
    start = time.perf_counter()
    tokens = _lookahead_tokens(model, PrefillResult(cache, logits, batch), observation.lookahead_steps)
    _sync(model)
    lookahead_s = time.perf_counter() - start
    first = batch.width - observation.tail(batch.width)
    state = _run(model, method, batch.with_tokens(tokens), _prefix(cache, first), first, observer)
    state.stats.prefill_s += lookahead_s
    return PrefillResult(state.cache, logits, batch)


def _defers(method: Method) -> bool:
    return method.evicts and method.observation().lookahead_steps > 0


@torch.no_grad()
def prefill(model, method: Method, batch: PromptBatch, *, observer=None) -> PrefillResult:
    """Prefill ``batch`` once, evicting layer by layer; return the cache and first-token logits.

    For DapQ the batch already carries the pseudo tokens; the logits are taken at the last
    *prompt* column (position Lp-1), which causality makes identical to a plain prefill.
    ``observer(ctx)``, if given, sees each layer's :class:`LayerContext` before selection.
    Methods with look-ahead steps (DeferKV) prefill without eviction, then evict once their
    decoding steps have run.
    """
    check_supported(model)
    if _defers(method):
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

    The cache is consumed (its tensors move into the returned :class:`CompressedCache`). Only the
    queries the method observes are replayed, so the cost matches scoring inside the prefill:

    - nothing observed (``streamingllm``, ``lacache``, ``random``, ``full``): no forward pass;
    - pseudo tokens only (``dapq``): one forward of the N pseudo tokens on top of the full cache;
    - a prompt tail (``snapkv``, ``pyramidkv``; ``dapq_hybrid`` with its pseudo tokens): the last
      W prompt tokens are cropped and re-run;
    - look-ahead steps (``deferkv``): the last prompt token (for the first token), T-1 decode
      steps, then the prompt tail and the T decoded tokens;
    - every prompt query (``h2o``): the prompt is re-run.

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
    if _defers(method):
        # Replay the last prompt token for the first-token logits, then decode and evict.
        plain = _run(model, _NO_EVICTION, batch, _prefix(cache, width - 1), width - 1)
        return _deferred(model, method, batch, plain.cache, plain.logits, observer)
    observation = method.observation()
    if not method.evicts or observation.queries(width) == 0:
        first = batch.input_ids.shape[1]  # nothing to replay: score from the cache alone
    else:
        # Re-run the prompt tokens whose queries the method observes (none for DapQ, the last W
        # for SnapKV, all of them for H2O), then its extra tokens, on top of the rest.
        first = width - observation.tail(width)
    return _run(model, method, batch, _prefix(cache, first), first, observer)


_NO_EVICTION = FullKV()


def _esize(model) -> int:
    return torch.finfo(model.dtype).bits // 8
