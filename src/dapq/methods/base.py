"""The contract between a compression method and the compression engine.

A method is a small, picklable dataclass: configuration only, no model, no tensors, no global
state, so it can be shipped to Ray actors or wrapped as a kvpress press. It tells the engine
(:mod:`dapq.compress`) two things:

1. what it **observes** (:meth:`Method.observation`): which queries score the prompt, as one
   :class:`Observation` (the prompt's own last tokens, extra pseudo tokens at chosen positions,
   real look-ahead decoding steps) and how many recent tokens it always keeps;
2. how it **scores** (:meth:`Method.score`): one importance value per prompt column and KV head,
   from a :class:`LayerContext`, once per layer, right after that layer's attention has written
   the prompt's keys and values to the cache during prefill.

The engine does everything else (the extra columns of the prefill, the query projection, the
selection, the per-layer budget schedule), so a new scoring method is one file and one
``@register`` line: see the README's "Adding a method".

Parameters are declared once, on the fields, with :func:`param`: ranges, choices and types are
checked by :meth:`Method.__post_init__` in one loop, with one-line messages, before any model
loads.

Budget convention (KVCache-Factory, shared by every method here): the budget ``K`` is the number
of prompt tokens kept *per KV head per layer*, and it includes any always-kept recent window.
"""

from __future__ import annotations

import math
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from functools import cache
from typing import Any, ClassVar

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
from .budgets import HEAD_BUDGETS, LAYER_BUDGETS, pyramid_budgets

#: Parameters added after results files in today's format existed, with their defaults: a
#: configuration records them only when set (:meth:`Method.config`), so stored cells keep their keys.
RECORDED_WHEN_SET: dict[str, Any] = {"head_budget": "flat", "head_floor": 0.2}
#: ``Observation.prompt_tail`` value meaning "every prompt token" (H2O).
ALL_PROMPT = -1
#: Softmax support of the observation queries: the prompt keys only, or also the keys after it.
NORMALIZE = ("prompt", "all")


def param(default: Any = MISSING, *, ge: float | None = None, le: float | None = None, gt: float | None = None,
          lt: float | None = None, choices: tuple | None = None) -> Any:
    """A method parameter with its allowed values, checked by :meth:`Method.__post_init__`.

    The type comes from the field's annotation (``int``, ``float``, ``str``, ``tuple[int, ...]``,
    each optionally ``| None``); ``ge``/``le``/``gt``/``lt`` bound numbers, ``choices`` lists the
    allowed values.
    """
    return field(default=default, metadata={"ge": ge, "le": le, "gt": gt, "lt": lt, "choices": choices})


@dataclass(frozen=True)
class Observation:
    """What a method observes at every layer: the queries that score the prompt, and what it always keeps.

    The engine lays the observation queries out as the last columns of one forward pass, in this
    order: the prompt's last ``prompt_tail`` tokens, then either ``pseudo_tokens`` extra tokens
    (ids and positions from :meth:`Method.pseudo_tokens` / :meth:`Method.pseudo_positions`) or
    ``lookahead_steps`` real greedy decoding steps. Those extra columns only score: they are
    evicted with the rest, and decoding resumes at position Lp.

    Parameters
    ----------
    prompt_tail : int
        The prompt's last tokens whose queries score (SnapKV's observation window W);
        :data:`ALL_PROMPT` for every prompt token (H2O).
    pseudo_tokens : int
        Extra tokens appended after the prompt for scoring only (DapQ's N, the oracle's T).
    lookahead_steps : int
        Real greedy decoding steps over the full cache whose queries score (DeferKV's T); the
        eviction then waits for them.
    keep_recent : int
        The prompt's last tokens that are always kept (they count against the budget).
    """

    prompt_tail: int = 0
    pseudo_tokens: int = 0
    lookahead_steps: int = 0
    keep_recent: int = 0

    def __post_init__(self) -> None:
        if self.pseudo_tokens and self.lookahead_steps:
            raise ValueError("an observation has pseudo tokens or look-ahead steps, not both")

    def tail(self, prompt_width: int) -> int:
        """How many of the prompt's last columns are observation queries."""
        return prompt_width if self.prompt_tail == ALL_PROMPT else min(self.prompt_tail, prompt_width)

    @property
    def extra(self) -> int:
        """Columns after the prompt: pseudo tokens or look-ahead steps."""
        return self.pseudo_tokens + self.lookahead_steps

    def queries(self, prompt_width: int) -> int:
        """How many observation queries the engine recomputes at each layer."""
        return self.tail(prompt_width) + self.extra


@dataclass
class LayerContext:
    """What a method sees at one layer. Shapes use B batch, P padded prompt width (left padded)."""

    layer_idx: int
    num_layers: int
    keys: Tensor
    """(B, Hkv, S, d) post-RoPE keys of this forward pass; prompt keys are columns ``[:P]``."""
    queries: Tensor | None
    """(B, Hq, Q, d) post-RoPE observation queries (see :class:`Observation` for their order), or None."""
    query_cols: range | None
    """Physical column of each observation query (the causal order of the prefill)."""
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
    n_tail: int = 0
    """How many of the queries are the prompt's own last tokens; the rest come after the prompt."""
    padded: bool = True
    """False when no row of the batch has padding: scoring then skips every mask."""

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
    keep_fraction : float, optional
        Fraction of each prompt kept, in (0, 1); the budget becomes ``ceil(keep_fraction * Lp)``.
        kvpress's ``compression_ratio`` is the fraction *removed*, ``1 - keep_fraction``.
    layer_budget : {"flat", "pyramid"}
        The same budget in every layer, or PyramidKV's schedule (Cai et al., 2024, arXiv
        2406.02069) with the same mean, the always-kept recent tokens playing its window.
    pyramid_beta : int
        Steepness of the pyramid (20 in the paper and KVCache-Factory).
    head_budget : {"flat", "adaptive"}
        The same budget for every KV head of a layer, or Ada-KV's split (Feng et al., 2024, arXiv
        2407.11550): the layer keeps its ``Hkv * K`` (head, token) pairs of highest score, so heads
        keep different counts (:func:`~dapq.methods.budgets.head_counts`). Every head then holds
        as many physical slots as the largest count, the others masked: the attention is that of
        the chosen pairs, the memory that of the padded layout, and decoding needs dapq's loop
        (``cache.canonical`` is False; ``model.generate()`` cannot mask per head).
    head_floor : float
        Ada-KV's safeguard: the share of ``K`` every head keeps whatever its scores.

    A budget that reaches the prompt length means no eviction for that prompt.
    """

    name: ClassVar[str] = "base"
    paper: ClassVar[str] = ""
    #: False for the methods that keep everything (FullKV).
    evicts: ClassVar[bool] = True
    #: True for methods that only exist to analyse others (two passes, not deployable).
    analysis_only: ClassVar[bool] = False
    #: The parameter that sizes the observation window (SnapKV's W, DapQ's N), which the analyses
    #: sweep; None where there is none.
    window_param: ClassVar[str | None] = None
    #: Named parameter sets for ``build(name, preset=...)``.
    presets: ClassVar[dict[str, dict]] = {}
    #: True when ``score`` reads only positions and lengths, never a layer's keys or queries
    #: (StreamingLLM): every layer with the same budget then keeps the same columns, and the
    #: engine selects them once per forward instead of once per layer.
    layer_invariant: ClassVar[bool] = False

    budget: int | None = param(None, ge=1)
    keep_fraction: float | None = param(None, gt=0.0, lt=1.0)
    layer_budget: str = param("flat", choices=LAYER_BUDGETS)
    pyramid_beta: int = param(20, ge=1)
    head_budget: str = param("flat", choices=HEAD_BUDGETS)
    head_floor: float = param(0.2, ge=0.0, le=1.0)

    def __post_init__(self) -> None:
        check_params(self)
        if self.head_budget != "flat" and (self.layer_invariant or not self.evicts):
            raise ConfigError(f"head_budget='adaptive' needs a method whose scores differ between heads; "
                              f"{self.name!r} ranks every head alike")
        if self.budget is not None and self.keep_fraction is not None:
            raise ConfigError("give either a budget or a keep_fraction, not both")
        if self.evicts and self.budget is None and self.keep_fraction is None:
            raise ConfigError(f"method {self.name!r} needs a budget or a keep_fraction")

    # ----------------------------------------------------------------- the contract
    def observation(self) -> Observation:
        """What this method observes at every layer (nothing, by default: position-only methods)."""
        return Observation()

    def score(self, ctx: LayerContext) -> Tensor:
        """Importance of each prompt column, (B, Hkv, P). Higher is kept first."""
        raise TypeError(f"{type(self).__name__} must implement score()")

    def pseudo_tokens(self, prompt_ids: list[int], *, vocab_size: int, model_type: str, tokenizer=None,
                      model=None) -> list[int]:
        """The ids of the ``observation().pseudo_tokens`` extra tokens for one prompt."""
        raise TypeError(f"{type(self).__name__} observes pseudo tokens and must implement pseudo_tokens()")

    def pseudo_positions(self, prompt_len: int) -> list[int]:
        """Their RoPE positions (by default the first decoding positions, Lp, Lp+1, ...)."""
        return list(range(prompt_len, prompt_len + self.observation().pseudo_tokens))

    # ----------------------------------------------------------------- budget
    def prompt_budget(self, prompt_len: int) -> int:
        """The budget for one prompt, before per-layer scheduling."""
        if not self.evicts:
            return prompt_len
        if self.budget is not None:
            return self.budget
        return max(1, math.ceil(float(self.keep_fraction) * prompt_len))

    def layer_budgets(self, prompt_len: int, num_layers: int) -> list[int]:
        """Budget of every layer for one prompt: flat, or the pyramid with the same mean."""
        budget = self.prompt_budget(prompt_len)
        if self.layer_budget == "flat" or not self.evicts:
            return [budget] * num_layers
        recent = min(self.observation().keep_recent, budget)
        return pyramid_budgets(budget, recent, prompt_len, num_layers, self.pyramid_beta)

    # ----------------------------------------------------------------- records
    def config(self) -> dict:
        """The full configuration, as recorded in results files.

        A parameter of :data:`RECORDED_WHEN_SET` appears only when it differs from its default: it
        was added after results files in this format existed, and the cell key hashes the
        configuration, so recording its default would orphan every cell stored before it.
        """
        return {"method": self.name, **{k: v for k, v in asdict(self).items()
                                        if k not in RECORDED_WHEN_SET or v != RECORDED_WHEN_SET[k]}}

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _kinds(annotation) -> tuple[set, bool]:
    """The plain types an annotation allows, and whether it allows None."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, _UnionType) else (annotation,)
    kinds = {typing.get_origin(a) or a for a in args if a is not type(None)}
    return kinds, type(None) in args


_UnionType = type(int | None)
_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", tuple: "a list of integers", bool: "true or false"}


def _coerce(name: str, value, kinds: set):
    """The value as the declared type, or a one-line error. Ints pass as floats; bools are not ints."""
    if tuple in kinds and isinstance(value, list | tuple):
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return tuple(value)
    elif float in kinds and isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value):
            return float(value) if int not in kinds else value
    elif int in kinds and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif type(value) in kinds:
        return value
    want = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)
    raise ConfigError(f"{name} must be {want}, got {value!r}")


def check_params(method) -> None:
    """Check every declared parameter of ``method`` against its type, range and choices, in field order."""
    hints = _hints(type(method))
    for f in fields(method):
        value = getattr(method, f.name)
        kinds, optional = _kinds(hints[f.name])
        if value is None:
            if optional:
                continue
            raise ConfigError(f"{f.name} must be given")
        value = _coerce(f.name, value, kinds)
        setattr(method, f.name, value)
        meta = f.metadata
        if meta.get("choices") is not None and value not in meta["choices"]:
            raise ConfigError(f"{f.name} must be one of {', '.join(map(str, meta['choices']))}, got {value!r}")
        for bound, ok, word in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                                ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<")):
            limit = meta.get(bound)
            if limit is not None and not ok(value, limit):
                raise ConfigError(f"{f.name} must be {word} {limit:g}, got {value!r}")


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
    group_reduce : {"mean", "max", "layer"}
        Reduction over the query heads of a GQA group; ``layer`` averages over every query head
        of the layer, so all KV heads keep the same tokens (TOVA).
    """

    kernel: int = param(7, ge=1)
    pooling: str = param("max", choices=POOL_MODES)
    query_reduce: str = param("sum", choices=QUERY_REDUCTIONS)
    group_reduce: str = param("mean", choices=GROUP_REDUCTIONS)

    def softmax_keys(self, ctx: LayerContext) -> int:
        """How many leading key columns the observation softmax normalizes over: the prompt's, or
        also the keys after it (pseudo or look-ahead keys) for methods with ``normalize="all"``."""
        return ctx.keys.shape[2] if getattr(self, "normalize", "prompt") == "all" else ctx.width

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
            key_valid=ctx.valid[:, :n_keys] if ctx.padded else None,
            scaling=ctx.scaling,
            n_scored=ctx.width,
            query_reduce=reduce or self.query_reduce,
            query_valid=None if ctx.query_valid is None or not ctx.padded else ctx.query_valid[:, queries],
        )

    def mixed_scores(self, ctx: LayerContext, weight: float) -> Tensor:
        """``(1 - weight) * A_late + weight * A_tail``: the prompt-tail queries against the later ones.

        ``A_tail`` reduces the prompt's own last queries (as in SnapKV) and ``A_late`` the queries
        after the prompt (pseudo or real decoding queries); each is a mean (or a max, with
        ``query_reduce="max"``), so the balance does not depend on the group sizes.
        """
        per_query = "max" if self.query_reduce == "max" else "mean"
        late = self.observation_scores(ctx, slice(ctx.n_tail, None), per_query)
        if ctx.n_tail == 0 or weight == 0.0:
            return late
        tail = self.observation_scores(ctx, slice(0, ctx.n_tail), per_query)
        return (1.0 - weight) * late + weight * tail

    def importance(self, ctx: LayerContext) -> Tensor:
        """(B, Hq, P) importance of each prompt column, before the GQA reduction and pooling.

        All observation queries reduced together; the variants with two groups of queries
        override this with :meth:`mixed_scores`.
        """
        return self.observation_scores(ctx)

    def score(self, ctx: LayerContext) -> Tensor:
        width = ctx.width
        scores = reduce_groups(self.importance(ctx), ctx.n_kv_heads, self.group_reduce)
        # Pool over the candidate keys only: the always-kept recent window is cut off first, as
        # SnapKV and kvpress do, so its scores never leak into its neighbours.
        cut = width - min(self.observation().keep_recent, width)
        if cut == 0:
            return scores  # a prompt no longer than the recent tokens: everything is kept anyway
        pooled = pool_scores(scores[..., :cut] * ctx.valid[:, None, :cut], self.kernel, self.pooling)
        return torch.cat([pooled, scores[..., cut:]], dim=-1)
