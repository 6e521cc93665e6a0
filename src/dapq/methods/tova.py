"""TOVA: the last prompt token's attention, one ranking per layer (Oren et al., 2024, arXiv 2401.06104)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..scoring import GROUP_REDUCTIONS
from .base import AttentionScoredMethod, Observation, param
from .registry import register


@register
@dataclass
class TOVA(AttentionScoredMethod):
    """TOVA (Token Omission Via Attention), applied once at the end of prefill.

    The paper evicts, at every step, the token that the current query attends to least, with the
    attention averaged over all heads of the layer (Section 3). Applied once to a prompt, that is
    a top-``budget`` by the last prompt token's softmax row, head-averaged, with the last token
    itself kept; this is what kvpress's ``TOVAPress`` does, so the two keep the same tokens. It is
    SnapKV with a one-token window, no pooling and a layer-wide instead of a per-group reduction.

    Native here so that the context-mode comparison it leads can be run at the size of the other
    rows: kvpress's pipeline decodes to ``max_new_tokens`` on every prompt, dapq's stops at the
    task's stop strings.

    Parameters
    ----------
    kernel : int
        Pooling kernel; TOVA pools nothing (1).
    group_reduce : {"layer", "mean", "max"}
        TOVA averages over every head of the layer (``layer``); ``mean`` ranks per KV head.
    """

    name: ClassVar[str] = "tova"
    paper: ClassVar[str] = "TOVA (Oren et al., 2024)"

    kernel: int = param(1, ge=1)
    group_reduce: str = param("layer", choices=GROUP_REDUCTIONS)

    def observation(self) -> Observation:
        return Observation(prompt_tail=1, keep_recent=1)
