"""PyramidKV: SnapKV scores with a pyramid of per-layer budgets (Cai et al., 2024, arXiv 2406.02069)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import param
from .budgets import LAYER_BUDGETS
from .registry import register
from .snapkv import SnapKV


@register
@dataclass
class PyramidKV(SnapKV):
    """PyramidKV: SnapKV's selection, with the budget funnelled from lower to upper layers.

    The schedule is the one every method accepts (``layer_budget="pyramid"``, steepness
    ``pyramid_beta``, 20 in the paper and KVCache-Factory); PyramidKV is SnapKV with it on.
    """

    name: ClassVar[str] = "pyramidkv"
    paper: ClassVar[str] = "PyramidKV (Cai et al., 2024)"

    layer_budget: str = param("pyramid", choices=LAYER_BUDGETS)
