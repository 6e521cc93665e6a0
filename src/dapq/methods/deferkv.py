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
3. a forward of the last ``window`` prompt tokens and the ``steps`` decoded tokens at their real
   positions Lp.., whose queries score the prompt at every layer; then eviction.

Decoding then starts at Lp from the logits of step 1, as for every method, so the first tokens
are re-fed (one step each) on the compressed cache. The full cache of every layer lives until
step 3 (the single-pass methods prune each layer right after its own attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from .base import NORMALIZE, AttentionScoredMethod, LayerContext, Observation, param
from .registry import register


@register
@dataclass
class DeferKV(AttentionScoredMethod):
    """Score with the first ``steps`` real decoding queries plus the last ``window`` prompt queries.

    Parameters
    ----------
    steps : int
        T, real (greedy) decoding steps whose queries score the prompt. T = 1 needs no decode
        step at all (the first token comes from the prefill's logits); the default T = 4 won the
        tuning on the embedded model (docs/results/tuning), where T = 1 keeps too little.
    window : int
        W, the prompt's last tokens whose queries also score (0: decoding queries only).
    prompt_weight : float
        alpha in [0, 1]: ``(1 - alpha) * A_decode + alpha * A_window`` (means over each group).
    keep_recent : int
        Last prompt tokens always kept (they count against the budget).
    normalize : {"all", "prompt"}
        ``all`` normalizes each decoding query's softmax over the prompt and the decoded tokens
        before it, exactly as in real decoding; ``prompt`` over the prompt keys only.
    """

    name: ClassVar[str] = "deferkv"
    paper: ClassVar[str] = "variant: DeferKV (Wang et al., 2026)"

    steps: int = param(4, ge=1, le=1024)
    window: int = param(8, ge=0)
    prompt_weight: float = param(0.5, ge=0.0, le=1.0)
    keep_recent: int = param(8, ge=0)
    normalize: str = param("all", choices=NORMALIZE)

    def observation(self) -> Observation:
        return Observation(prompt_tail=self.window, lookahead_steps=self.steps, keep_recent=self.keep_recent)

    def importance(self, ctx: LayerContext) -> Tensor:
        return self.mixed_scores(ctx, self.prompt_weight)
