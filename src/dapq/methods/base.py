"""The contract between a compression method and the compression engine.

A method is a small, picklable dataclass: configuration only, no model, no tensors, no global
state, so it can be shipped to Ray actors or wrapped as a kvpress press. The engine
(:mod:`dapq.compress`) calls it once per layer, right after that layer's attention has written
the prompt's keys and values to the cache during prefill, with a :class:`LayerContext`.

Budget convention (KVCache-Factory, shared by every method here): the budget ``K`` is the number
of prompt tokens kept *per KV head per layer*, and it includes any always-kept recent window.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import ClassVar

import torch
from torch import Tensor

from ..errors import ConfigError
from ..scoring import (
    GROUP_REDUCTIONS,
    POOL_MODES,
    QUERY_REDUCTIONS,
    attention_scores,
    pool_scores,
    reduce_groups,
)


@dataclass
class LayerContext:
    """What a method sees at one layer. Shapes use B batch, P padded prompt width (left padded)."""

    layer_idx: int
    num_layers: int
    keys: Tensor
    """(B, Hkv, S, d) post-RoPE keys of this forward pass; prompt keys are columns ``[:P]``."""
    queries: Tensor | None
    """(B, Hq, Q, d) post-RoPE observation queries, or None for methods that use none."""
    query_cols: Tensor | None
    """(Q,) physical column of each observation query (the causal order of the prefill)."""
    query_valid: Tensor | None
    """(B, Q) bool, False for queries at padding columns."""
    valid: Tensor
    """(B, S) bool, True for real tokens (prompt and, for DapQ, pseudo tokens)."""
    positions: Tensor
    """(B, P) logical position of each prompt column; -1 at padding."""
    prompt_lengths: Tensor
    """(B,) real prompt length of each row."""
    width: int
    """P, the padded prompt width."""
    scaling: float
    model_type: str

    @property
    def n_kv_heads(self) -> int:
        return self.keys.shape[1]


@dataclass
class Method:
    """Base class of all compression methods.

    Parameters
    ----------
    budget : int, optional
        Prompt tokens kept per KV head per layer (the papers' "KV cache size").
    ratio : float, optional
        Fraction of each prompt kept, in (0, 1); the budget becomes ``ceil(ratio * Lp)``.
        (kvpress's ``compression_ratio`` is ``1 - ratio``.)

    A budget that reaches the prompt length means no eviction for that prompt.
    """

    name: ClassVar[str] = "base"
    paper: ClassVar[str] = ""
    #: Which queries the engine must recompute: "none", "suffix" (last ``num_queries`` prompt
    #: tokens), "all" (every prompt token) or "pseudo" (the appended pseudo tokens).
    query_source: ClassVar[str] = "none"
    #: True for methods that only exist to analyse others (two passes, not deployable).
    analysis_only: ClassVar[bool] = False

    budget: int | None = None
    ratio: float | None = None

    def __post_init__(self) -> None:
        if self.budget is not None and self.ratio is not None:
            raise ConfigError("give either a budget or a ratio, not both")
        if self.budget is not None and (not isinstance(self.budget, int) or self.budget < 1):
            raise ConfigError(f"budget must be an integer >= 1, got {self.budget!r}")
        if self.ratio is not None and not (0.0 < float(self.ratio) < 1.0):
            raise ConfigError(f"ratio must lie in (0, 1), got {self.ratio!r}")
        if self.evicts and self.budget is None and self.ratio is None:
            raise ConfigError(f"method {self.name!r} needs a budget or a ratio")

    # ----------------------------------------------------------------- budget
    @property
    def evicts(self) -> bool:
        return True

    def prompt_budget(self, prompt_len: int) -> int:
        """The budget for one prompt, before per-layer scheduling."""
        if not self.evicts:
            return prompt_len
        if self.budget is not None:
            return self.budget
        return max(1, math.ceil(float(self.ratio) * prompt_len))

    def layer_budgets(self, prompt_len: int, num_layers: int) -> list[int]:
        """Budget of every layer for one prompt. Flat unless a method overrides it (PyramidKV)."""
        return [self.prompt_budget(prompt_len)] * num_layers

    # ----------------------------------------------------------------- queries
    def num_queries(self, prompt_width: int) -> int:
        """How many observation queries the engine must recompute at each layer.

        They are the last ``num_queries`` columns of the forward pass: the prompt's own last
        tokens, followed by the method's :attr:`extra_tokens` (DapQ's pseudo tokens) if any.
        """
        return 0

    @property
    def extra_tokens(self) -> int:
        """Tokens appended after the prompt for scoring only, and evicted with it (DapQ's N)."""
        return 0

    @property
    def lookahead(self) -> int:
        """Real decoding steps the engine runs over the full cache before scoring (DeferKV's T).

        Their tokens are appended like extra tokens, at positions Lp.., and scored with; they are
        known only after a plain prefill, so the eviction is deferred to after it.
        """
        return 0

    def prompt_queries(self, prompt_width: int) -> int:
        """How many observation queries are the prompt's own last tokens.

        :func:`dapq.compress.compress` replays exactly these prompt tokens (plus the extra tokens)
        on a cache someone else prefilled.
        """
        return self.num_queries(prompt_width) - self.extra_tokens - self.lookahead

    @property
    def recent(self) -> int:
        """Most recent prompt tokens that are always kept (they count against the budget)."""
        return 0

    # ----------------------------------------------------------------- scoring
    def score(self, ctx: LayerContext) -> Tensor:
        """Importance of each prompt column, (B, Hkv, P). Higher is kept first."""
        raise TypeError(f"{type(self).__name__} must implement score()")

    def config(self) -> dict:
        """The full configuration, as recorded in results files."""
        return {"method": self.name, **asdict(self)}

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}


@dataclass
class AttentionScoredMethod(Method):
    """Shared parameters and scoring of methods that rank keys by observation-query attention.

    Parameters
    ----------
    kernel : int
        1-D pooling kernel over the key axis (1 = no pooling). SnapKV, Eq. (2)-(3).
    pooling : {"max", "avg"}
        Pooling mode.
    query_reduce : {"sum", "mean", "max"}
        Reduction over observation queries.
    group_reduce : {"mean", "max"}
        Reduction over the query heads of a GQA group.
    """

    kernel: int = 7
    pooling: str = "max"
    query_reduce: str = "sum"
    group_reduce: str = "mean"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kernel < 1:
            raise ConfigError(f"kernel must be >= 1, got {self.kernel}")
        for value, allowed, what in ((self.pooling, POOL_MODES, "pooling"),
                                     (self.query_reduce, QUERY_REDUCTIONS, "query_reduce"),
                                     (self.group_reduce, GROUP_REDUCTIONS, "group_reduce")):
            if value not in allowed:
                raise ConfigError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")

    def normalise_over_extra(self) -> bool:
        """Whether the softmax also covers keys after the prompt (DapQ's pseudo keys)."""
        return False

    def softmax_keys(self, ctx: LayerContext) -> int:
        """How many leading key columns the observation softmax normalises over."""
        return ctx.keys.shape[2] if self.normalise_over_extra() else ctx.width

    def observation_scores(self, ctx: LayerContext, queries: slice = slice(None), reduce: str | None = None) -> Tensor:
        """Attention of (a slice of) the observation queries over the prompt, reduced over them.

        Returns (B, Hq, P) fp32 scores: SnapKV's Eq. (1), or the DapQ paper's pseudo-query
        importance (Section 3, Figure 1) when the queries are the pseudo tokens'.
        """
        n_keys = self.softmax_keys(ctx)
        return attention_scores(
            ctx.queries[:, :, queries],
            ctx.keys[:, :, :n_keys],
            query_cols=ctx.query_cols[queries],
            key_valid=ctx.valid[:, :n_keys],
            scaling=ctx.scaling,
            n_scored=ctx.width,
            query_reduce=reduce or self.query_reduce,
            query_valid=None if ctx.query_valid is None else ctx.query_valid[:, queries],
        )

    def mixed_scores(self, ctx: LayerContext, n_window: int, weight: float) -> Tensor:
        """``(1 - weight) * A_late + weight * A_window`` over two groups of observation queries.

        ``A_window`` reduces the first ``n_window`` queries (the prompt's own last tokens, as in
        SnapKV) and ``A_late`` the rest (pseudo or real decoding queries); each is a mean (or a
        max, with ``query_reduce="max"``), so the balance does not depend on the group sizes.
        """
        per_query = "max" if self.query_reduce == "max" else "mean"
        late = self.observation_scores(ctx, slice(n_window, None), per_query)
        if n_window == 0 or weight == 0.0:
            return late
        window = self.observation_scores(ctx, slice(0, n_window), per_query)
        return (1.0 - weight) * late + weight * window

    def importance(self, ctx: LayerContext) -> Tensor:
        """(B, Hq, P) importance of each prompt column, before the GQA reduction and pooling.

        All observation queries reduced together; methods with two groups of queries (the
        variants) override this with :meth:`mixed_scores`.
        """
        return self.observation_scores(ctx)

    def score(self, ctx: LayerContext) -> Tensor:
        width = ctx.width
        scores = reduce_groups(self.importance(ctx), ctx.n_kv_heads, self.group_reduce)
        # Pool over the candidate keys only: the always-kept recent window is cut off first, as
        # SnapKV and kvpress do, so its scores never leak into its neighbours.
        cut = width - min(self.recent, width)
        pooled = pool_scores(scores[..., :cut] * ctx.valid[:, None, :cut], self.kernel, self.pooling)
        return torch.cat([pooled, scores[..., cut:]], dim=-1)
