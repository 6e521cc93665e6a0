"""The oracle: scores prompt tokens by the attention of the real first-T decoding queries.

Analysis only. It is the upper bound every eviction method is measured against, and it is honest
about its cost: a first pass decodes T greedy tokens with the full cache, a second prefill runs
the prompt followed by those T tokens at their real positions Lp .. Lp+T-1. Causality makes the
queries of that suffix exactly the real decoding queries, so scoring them with the shared DapQ
machinery (pseudo tokens = the real continuation, softmax over prompt plus generated keys, no
pooling) keeps exactly the top-K of the real decode attention summed over T steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import ConfigError
from .base import AttentionScoredMethod
from .registry import register


@register
@dataclass
class Oracle(AttentionScoredMethod):
    """Top-K by the real decoding attention of the first ``window`` generated tokens.

    Parameters
    ----------
    window : int
        T, the decoding steps whose queries score the prompt.
    """

    name: ClassVar[str] = "oracle"
    paper: ClassVar[str] = "analysis only: real decode attention (2 passes)"
    query_source: ClassVar[str] = "pseudo"
    analysis_only: ClassVar[bool] = True

    window: int = 32
    kernel: int = 1
    normalize: str = "all"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window < 1:
            raise ConfigError(f"window must be >= 1, got {self.window}")
        if self.normalize not in ("prompt", "all"):
            raise ConfigError(f"normalize must be 'prompt' or 'all', got {self.normalize!r}")

    def num_queries(self, prompt_width: int) -> int:
        return self.window

    @property
    def extra_tokens(self) -> int:
        return self.window

    def normalise_over_extra(self) -> bool:
        return self.normalize == "all"

    @torch.no_grad()
    def pseudo_tokens(self, prompt_ids: list[int], *, model=None, **_) -> list[int]:
        """The first pass: the FullKV greedy continuation of this prompt."""
        if model is None:
            raise ConfigError("the oracle needs the model to decode its first pass")
        ids = torch.tensor([prompt_ids], device=model.device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=self.window,
                             min_new_tokens=self.window, do_sample=False, pad_token_id=0)
        return out[0, len(prompt_ids):].tolist()

    def pseudo_positions(self, prompt_len: int) -> list[int]:
        return list(range(prompt_len, prompt_len + self.window))
