"""DapQ as a kvpress press, for users of NVIDIA kvpress's pipeline.

``DapQPress`` runs dapq's DapQ method (Tian et al., 2026, arXiv 2603.11564: position-aware pseudo
queries, Figure 1) inside kvpress's ``kv-press-text-generation`` pipeline. Like kvpress's own
presses it never sees the question: it compresses the context during the context's prefill.

    from kvpress import KVPressTextGenerationPipeline
    from dapq.integrations.kvpress import DapQPress

    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer)
    press = DapQPress(compression_ratio=0.75, tokenizer=tokenizer)
    answer = pipe(context, question=question, press=press)["answer"]

How it fits kvpress's press contract. A press hooks every attention layer and prunes that layer's
cache after the context's prefill. DapQ needs the queries of N pseudo tokens placed at the
positions right after the context (Lc, Lc+1, ...), computed in the same forward pass. So while the
press is active, a forward pre-hook on the base model appends the N pseudo tokens (and their
positions) to the context's prefill; at each layer :meth:`DapQPress.compress` recomputes the
pseudo tokens' queries from the layer input, scores the context keys with dapq's own scoring
(:mod:`dapq.scoring`, the method's ``score``), keeps kvpress's ``int(Lc * (1 - compression_ratio))``
context tokens per KV head and drops the pseudo tokens' keys and values. The pipeline then feeds
the question at positions Lc.. over the pruned cache, as for any press. The kept tokens are exactly
those of ``dapq.build("dapq", budget=n_kept)`` in context mode (``tests/integrations``).

``DeferKV`` has no press: it evicts after real decoding steps of the model, which a prefill hook
cannot run. Importing this module imports kvpress (which patches transformers' attention
functions); nothing else in dapq imports it.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from kvpress import BasePress
from kvpress.utils import compute_n_kept

from ..compress import select_slots
from ..methods import build
from ..methods.base import LayerContext
from ..scoring import project_queries


@dataclass
class DapQPress(BasePress):
    """DapQ's pseudo-query eviction as a kvpress press.

    Parameters
    ----------
    compression_ratio : float
        Fraction of the context removed (kvpress's convention; dapq's ``ratio`` is ``1 - this``).
    tokenizer : optional
        Needed for the text pseudo contents (``fixed``, the default, and ``text``).
    window, content, text, keep_recent, position_offset, normalize, kernel, pooling, query_reduce,
    group_reduce, preset
        DapQ's parameters, with dapq's defaults (:class:`dapq.methods.dapq.DapQ`); ``preset="paper"``
        is the paper's recipe.
    """

    compression_ratio: float = 0.0
    tokenizer: object = field(default=None, repr=False, compare=False)
    window: int = 32
    content: str = "fixed"
    text: str | None = None
    keep_recent: int = 0
    position_offset: int = 0
    normalize: str = "prompt"
    kernel: int = 7
    pooling: str = "max"
    query_reduce: str = "sum"
    group_reduce: str = "mean"
    preset: str | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.compression_ratio < 1.0:
            raise ValueError(f"compression_ratio must lie in [0, 1), got {self.compression_ratio}")
        params = dict(window=self.window, content=self.content, text=self.text, keep_recent=self.keep_recent,
                      position_offset=self.position_offset, normalize=self.normalize, kernel=self.kernel,
                      pooling=self.pooling, query_reduce=self.query_reduce, group_reduce=self.group_reduce)
        if self.preset is not None:
            # Parameters left at their defaults yield to the preset; the budget is set per call.
            defaults = {f: DapQPress.__dataclass_fields__[f].default for f in params}
            params = {k: v for k, v in params.items() if v != defaults[k]} | {"preset": self.preset}
        # The budget is kvpress's n_kept, computed per context in compress(); any valid one builds.
        self.method = build("dapq", budget=1, **params)
        self._context_length = 0

    @contextmanager
    def __call__(self, model):
        """kvpress's context manager, plus the pre-hook that appends the pseudo tokens to the prefill."""
        base = model.model

        def append_pseudo_tokens(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            # kvpress calls the base model itself, with `past_key_values` (it needs transformers < 5.3,
            # before attention layers took `cache=`); `cache` is read too in case a later kvpress passes it.
            cache = kwargs.get("past_key_values", kwargs.get("cache"))
            if self.compression_ratio == 0 or ids is None or (cache is not None and cache.get_seq_length() > 0):
                return args, kwargs  # only the context's prefill carries pseudo tokens
            self._context_length = ids.shape[1]
            rows = [self.method.pseudo_tokens(row.tolist(), vocab_size=model.config.vocab_size,
                                              model_type=model.config.model_type, tokenizer=self.tokenizer,
                                              model=model) for row in ids]
            pseudo = torch.tensor(rows, dtype=ids.dtype, device=ids.device)
            positions = torch.tensor(list(range(ids.shape[1])) + self.method.pseudo_positions(ids.shape[1]),
                                     device=ids.device)
            kwargs = {**kwargs, "input_ids": torch.cat([ids, pseudo], dim=1),
                      "position_ids": positions[None].expand(ids.shape[0], -1)}
            if kwargs.get("attention_mask") is not None:
                mask = kwargs["attention_mask"]
                kwargs["attention_mask"] = torch.cat([mask, torch.ones_like(pseudo, dtype=mask.dtype)], dim=1)
            return args[1:] if args else args, kwargs

        handle = base.register_forward_pre_hook(append_pseudo_tokens, with_kwargs=True)
        try:
            with super().__call__(model):
                yield
        finally:
            handle.remove()

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        """Keep the context tokens DapQ's pseudo queries attend to most; drop the pseudo tokens."""
        if self.compression_ratio == 0:
            return keys, values
        n_pseudo = self.method.window
        width = self._context_length
        bsz, n_cols = keys.shape[0], keys.shape[2]
        cos, sin = kwargs["position_embeddings"]
        queries = project_queries(module, hidden_states[:, -n_pseudo:], cos[:, -n_pseudo:], sin[:, -n_pseudo:])
        device = keys.device
        ctx = LayerContext(
            layer_idx=module.layer_idx, num_layers=module.config.num_hidden_layers, keys=keys, queries=queries,
            query_cols=torch.arange(n_cols - n_pseudo, n_cols, device=device),
            query_valid=torch.ones(bsz, n_pseudo, dtype=torch.bool, device=device),
            valid=torch.ones(bsz, n_cols, dtype=torch.bool, device=device),
            positions=torch.arange(width, device=device)[None].expand(bsz, -1),
            prompt_lengths=torch.full((bsz,), width, device=device), width=width, scaling=module.scaling,
            model_type=module.config.model_type,
        )
        n_kept = compute_n_kept(width, self.compression_ratio)
        kept = torch.full((bsz,), n_kept, device=device)
        indices, _ = select_slots(self.method, ctx, kept, n_kept)
        gather = indices[..., None].expand(-1, -1, -1, keys.shape[-1])
        return keys[:, :, :width].gather(2, gather).contiguous(), values[:, :, :width].gather(2, gather).contiguous()
