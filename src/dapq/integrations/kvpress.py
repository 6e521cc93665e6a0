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
from dataclasses import field, fields, make_dataclass

import torch
from kvpress import BasePress
from kvpress.utils import compute_n_kept

from ..compress import gather_slots, select_slots
from ..methods import build
from ..methods.base import LayerContext
from ..methods.dapq import DapQ
from ..scoring import project_queries

#: DapQ's parameters a press takes: all of them but the budget, which kvpress sets per context
#: from its ``compression_ratio``, and the per-head split, which a press's cache (one length for
#: every head) cannot hold.
_DAPQ_PARAMS = tuple(f for f in fields(DapQ) if f.name not in ("budget", "keep_fraction", "head_budget", "head_floor"))


class _DapQPressBody:
    """The behaviour of :class:`DapQPress`; its fields are made from DapQ's below."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.compression_ratio < 1.0:
            raise ValueError(f"compression_ratio must lie in [0, 1), got {self.compression_ratio}")
        params = {f.name: getattr(self, f.name) for f in _DAPQ_PARAMS}
        if self.preset is not None:
            # Parameters left at their defaults yield to the preset; the budget is set per call.
            params = {f.name: params[f.name] for f in _DAPQ_PARAMS if params[f.name] != f.default}
            params["preset"] = self.preset
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
            with BasePress.__call__(self, model):
                yield
        finally:
            handle.remove()

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        """Keep the context tokens DapQ's pseudo queries attend to most; drop the pseudo tokens."""
        if self.compression_ratio == 0:
            return keys, values
        n_pseudo = self.method.n_pseudo
        width = self._context_length
        bsz, n_cols = keys.shape[0], keys.shape[2]
        cos, sin = kwargs["position_embeddings"]
        queries = project_queries(module, hidden_states[:, -n_pseudo:], cos[:, -n_pseudo:], sin[:, -n_pseudo:])
        device = keys.device
        ctx = LayerContext(
            layer_idx=module.layer_idx, num_layers=module.config.num_hidden_layers, keys=keys, queries=queries,
            query_cols=range(n_cols - n_pseudo, n_cols),
            query_valid=torch.ones(bsz, n_pseudo, dtype=torch.bool, device=device),
            valid=torch.ones(bsz, n_cols, dtype=torch.bool, device=device),
            positions=torch.arange(width, device=device)[None].expand(bsz, -1),
            prompt_lengths=torch.full((bsz,), width, device=device), width=width, scaling=module.scaling,
            model_type=module.config.model_type, padded=False,
        )
        n_kept = compute_n_kept(width, self.compression_ratio)
        kept = torch.full((bsz,), n_kept, device=device)
        indices, _ = select_slots(self.method, ctx, kept, n_kept)
        return gather_slots(keys, values, width, indices)


DapQPress = make_dataclass(
    "DapQPress",
    [("compression_ratio", float, field(default=0.0)),
     ("tokenizer", object, field(default=None, repr=False, compare=False)),
     *[(f.name, f.type, field(default=f.default, metadata=f.metadata)) for f in _DAPQ_PARAMS],
     ("preset", "str | None", field(default=None))],
    bases=(_DapQPressBody, BasePress),
    namespace={"__module__": __name__},
)
DapQPress.__doc__ = f"""DapQ's pseudo-query eviction as a kvpress press.

    Parameters
    ----------
    compression_ratio : float
        Fraction of the context *removed* (kvpress's convention); dapq's ``keep_fraction`` is
        ``1 - compression_ratio``.
    tokenizer : optional
        Needed for the text pseudo contents (``fixed``, the default, and ``text``).
    preset : str, optional
        ``"paper"``: the paper's recipe; parameters given next to it override it.
    {", ".join(f.name for f in _DAPQ_PARAMS)}
        DapQ's parameters (:class:`dapq.methods.dapq.DapQ`), with its defaults: the press takes
        every one of them, by construction.
    """
