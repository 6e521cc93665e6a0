"""The oracle: scores prompt tokens by the attention of the real first-T decoding queries.

Analysis only. It is the upper bound every eviction method is measured against, and it is honest
about its cost: a first pass decodes T greedy tokens with the full cache, a second prefill runs
the prompt followed by those T tokens at their real positions Lp .. Lp+T-1. Causality makes the
queries of that suffix exactly the real decoding queries, so scoring them as pseudo tokens (the
real continuation, softmax over prompt plus generated keys, no pooling) keeps exactly the top-K of
the real decode attention summed over T steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import ConfigError
from .base import NORMALIZE, AttentionScoredMethod, Observation, param
from .registry import register


@register
@dataclass
class Oracle(AttentionScoredMethod):
    """Top-K by the real decoding attention of the first ``steps`` generated tokens.

    Parameters
    ----------
    steps : int
        T, the decoding steps whose queries score the prompt.
    """

    name: ClassVar[str] = "oracle"
    paper: ClassVar[str] = "analysis only: real decode attention (2 passes)"
    analysis_only: ClassVar[bool] = True

    steps: int = param(32, ge=1, le=1024)
    kernel: int = param(1, ge=1)
    normalize: str = param("all", choices=NORMALIZE)

    def observation(self) -> Observation:
        return Observation(pseudo_tokens=self.steps)

    @torch.no_grad()
    def pseudo_tokens(self, prompt_ids: list[int], *, model=None, **_) -> list[int]:
        """The first pass: the FullKV greedy continuation of this prompt."""
        if model is None:
            raise ConfigError("the oracle needs the model to decode its first pass")
        ids = torch.tensor([prompt_ids], device=model.device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=self.steps,
                             min_new_tokens=self.steps, do_sample=False, pad_token_id=0)
        return out[0, len(prompt_ids):].tolist()
