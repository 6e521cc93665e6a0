"""H2O, one-shot after prefill (Zhang et al., 2023, arXiv 2306.14048)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import ConfigError
from .base import AttentionScoredMethod
from .registry import register


@register
@dataclass
class H2O(AttentionScoredMethod):
    """Heavy hitters: the column sums of the full causal attention of every prompt query.

    As in KVCache-Factory's one-shot variant, the top ``budget - window`` keys by accumulated
    attention are kept together with the last ``window`` tokens, without pooling. The column sums
    are computed in query blocks, so memory is O(block * Lp), not O(Lp^2); the compute is still
    quadratic, as it is in the original.
    """

    name: ClassVar[str] = "h2o"
    paper: ClassVar[str] = "H2O (Zhang et al., 2023)"
    query_source: ClassVar[str] = "all"

    window: int = 8
    kernel: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window < 1:
            raise ConfigError(f"window must be >= 1, got {self.window}")

    def num_queries(self, prompt_width: int) -> int:
        return prompt_width

    @property
    def recent(self) -> int:
        return self.window
