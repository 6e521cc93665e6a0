"""H2O, one-shot after prefill (Zhang et al., 2023, arXiv 2306.14048)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import ALL_PROMPT, AttentionScoredMethod, Observation, param
from .registry import register


@register
@dataclass
class H2O(AttentionScoredMethod):
    """Heavy hitters: the column sums of the full causal attention of every prompt query.

    As in KVCache-Factory's one-shot variant, the top ``budget - keep_recent`` keys by accumulated
    attention are kept together with the last ``keep_recent`` tokens, without pooling. The column
    sums are computed in query blocks, so memory is O(block * Lp), not O(Lp^2); the compute is
    still quadratic, as it is in the original.

    Parameters
    ----------
    keep_recent : int
        Last prompt tokens always kept (KVCache-Factory's recent window, 8).
    """

    name: ClassVar[str] = "h2o"
    paper: ClassVar[str] = "H2O (Zhang et al., 2023)"

    keep_recent: int = param(8, ge=1)
    kernel: int = param(1, ge=1)

    def observation(self) -> Observation:
        return Observation(prompt_tail=ALL_PROMPT, keep_recent=self.keep_recent)
