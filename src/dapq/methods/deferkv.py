"""DeferKV: evict at the first real decoding step, not at the end of prefill (a dapq variant).

Wang, Li, Sun, Wang et al., "DeferKV: Rethinking Eviction Timing for One-Shot KV Cache
Compression" (2026): the queries of the first real decoding steps predict later decode attention
better than any prompt-side window, so the one-shot eviction waits for them and combines them
with the prompt's own last queries. In the DapQ paper's terms (Tian et al., 2026, Table 1) these
are pseudo queries with the *same content and the same position* (SC&SP) as real decoding: the
limit DapQ's position-aware pseudo queries approximate.

What runs, and what it costs (all in one ``prefill`` call):

1. a plain FullKV prefill, which gives the logits at Lp-1 and so the first token;
2. ``steps - 1`` greedy decode steps over the full cache (3 by default; ~70 ms each at 4k here);
3. a forward of the last ``prompt_window`` prompt tokens and the ``steps`` decoded tokens at
   their real positions Lp.., whose queries score the prompt at every layer; then eviction.

Decoding then starts at Lp from the logits of step 1, as for every method, so the first tokens
are re-fed (one step each) on the compressed cache. The full cache of every layer lives until
step 3 (the single-pass methods prune each layer right after its own attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from ..errors import ConfigError
from .base import AttentionScoredMethod, LayerContext
from .registry import register


@register
@dataclass
class DeferKV(AttentionScoredMethod):
    """Score with the first ``steps`` real decoding queries plus the last ``prompt_window`` prompt queries.

    Parameters
    ----------
    steps : int
        T, real (greedy) decoding steps whose queries score the prompt. T = 1 needs no decode
        step at all (the first token comes from the prefill's logits); the default T = 4 won the
        tuning on the embedded model (docs/results/tuning), where T = 1 keeps too little.
    prompt_window : int
        W, the prompt's last tokens whose queries also score (0: decoding queries only).
    prompt_weight : float
        alpha in [0, 1]: ``(1 - alpha) * A_decode + alpha * A_window`` (means over each group).
    keep_recent : int
        Last prompt tokens always kept (they count against the budget).
    normalize : {"all", "prompt"}
        ``all`` normalises each decoding query's softmax over the prompt and the decoded tokens
        before it, exactly as in real decoding; ``prompt`` over the prompt keys only.
    """

    name: ClassVar[str] = "deferkv"
    paper: ClassVar[str] = "variant: DeferKV (Wang et al., 2026)"
    query_source: ClassVar[str] = "lookahead"

    steps: int = 4
    prompt_window: int = 8
    prompt_weight: float = 0.5
    keep_recent: int = 8
    normalize: str = "all"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")
        if self.prompt_window < 0 or self.keep_recent < 0:
            raise ConfigError("prompt_window and keep_recent must be >= 0")
        if not 0.0 <= self.prompt_weight <= 1.0:
            raise ConfigError(f"prompt_weight must lie in [0, 1], got {self.prompt_weight}")
        if self.normalize not in ("prompt", "all"):
            raise ConfigError(f"normalize must be 'prompt' or 'all', got {self.normalize!r}")

    @property
    def recent(self) -> int:
        return self.keep_recent

    @property
    def lookahead(self) -> int:
        return self.steps

    def num_queries(self, prompt_width: int) -> int:
        return min(self.prompt_window, prompt_width) + self.steps

    def normalise_over_extra(self) -> bool:
        return self.normalize == "all"

    def importance(self, ctx: LayerContext) -> Tensor:
        # Physical order: the window's queries, then the decoding steps'.
        return self.mixed_scores(ctx, ctx.queries.shape[2] - self.steps, self.prompt_weight)
