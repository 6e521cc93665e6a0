"""PyramidKV: SnapKV scores with a pyramid of per-layer budgets (Cai et al., 2024, arXiv 2406.02069)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import ConfigError
from .budgets import pyramid_budgets
from .registry import register
from .snapkv import SnapKV


@register
@dataclass
class PyramidKV(SnapKV):
    """PyramidKV: SnapKV's selection, with the budget funnelled from lower to upper layers.

    Parameters
    ----------
    beta : int
        Steepness of the pyramid (20 in the paper and KVCache-Factory).
    """

    name: ClassVar[str] = "pyramidkv"
    paper: ClassVar[str] = "PyramidKV (Cai et al., 2024)"

    beta: int = 20

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.beta < 1:
            raise ConfigError(f"beta must be >= 1, got {self.beta}")

    def layer_budgets(self, prompt_len: int, num_layers: int) -> list[int]:
        budget = self.prompt_budget(prompt_len)
        return pyramid_budgets(budget, min(self.window, budget), prompt_len, num_layers, self.beta)
