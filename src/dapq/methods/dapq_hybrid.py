"""DapQ-Hybrid: DapQ's pseudo queries together with the prompt's last W queries (a dapq variant).

Not in the DapQ paper. The pseudo queries (Tian et al., 2026, arXiv 2603.11564, Figure 1) carry
the *positions* of the first decoding steps; SnapKV's observation window (Li et al., 2024, Eq. 1)
carries the *content* of the question, which on small models decides which needle is asked for.
The two distributions are mixed with a weight, so the balance does not depend on N and W:

    s = (1 - alpha) * mean_pseudo(attention) + alpha * mean_window(attention)

It costs what DapQ costs: the window's queries are recomputed from the same single prefill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from .base import LayerContext, Observation, param
from .dapq import DapQ
from .registry import register


@register
@dataclass
class DapQHybrid(DapQ):
    """DapQ with SnapKV's last-``window`` prompt queries as a second observation window.

    Parameters
    ----------
    window : int
        W, the last prompt tokens whose queries also score the prompt (causally, as in SnapKV).
    prompt_weight : float
        alpha in [0, 1], the weight of the window's mean attention; ``1 - alpha`` goes to the
        pseudo queries' mean attention. With ``query_reduce="max"`` the two maxima are mixed.
        The default 0.75 recovered the most needle digits of 0.25 / 0.5 / 0.75 in the tuning
        sweep (exact match tied; docs/results/tuning).

    Every DapQ parameter (content, n_pseudo, keep_recent, pooling, ...) keeps its meaning.
    """

    name: ClassVar[str] = "dapq_hybrid"
    paper: ClassVar[str] = "variant: DapQ pseudo queries + SnapKV window"

    window: int = param(8, ge=1)
    prompt_weight: float = param(0.75, ge=0.0, le=1.0)

    def observation(self) -> Observation:
        return Observation(prompt_tail=self.window, pseudo_tokens=self.n_pseudo, keep_recent=self.keep_recent)

    def importance(self, ctx: LayerContext) -> Tensor:
        return self.mixed_scores(ctx, self.prompt_weight)
