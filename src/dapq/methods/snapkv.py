"""SnapKV: the last prompt tokens as observation window (Li et al., 2024, arXiv 2404.14469)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import AttentionScoredMethod, Observation, param
from .registry import register


@register
@dataclass
class SnapKV(AttentionScoredMethod):
    """SnapKV, following KVCache-Factory's reference settings.

    The last ``window`` prompt queries attend (causally, softmax over all prompt keys) to the
    prompt; their attention is summed (Eq. 1), pooled with a 1-D kernel (Eq. 2-3), averaged over
    the GQA group, and the top ``budget - window`` keys are kept together with the window itself.

    Parameters
    ----------
    window : int
        Observation window W, always kept. KVCache-Factory's LongBench/RULER scripts use 8.
    """

    name: ClassVar[str] = "snapkv"
    paper: ClassVar[str] = "SnapKV (Li et al., 2024)"
    window_param: ClassVar[str] = "window"

    window: int = param(8, ge=1)

    def observation(self) -> Observation:
        return Observation(prompt_tail=self.window, keep_recent=self.window)
