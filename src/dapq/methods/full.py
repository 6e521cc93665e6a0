"""FullKV: the uncompressed reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from .base import LayerContext, Method
from .registry import register


@register
@dataclass
class FullKV(Method):
    """Keep every prompt token. The accuracy ceiling and the speed/memory baseline."""

    name: ClassVar[str] = "full"
    paper: ClassVar[str] = "-"
    evicts: ClassVar[bool] = False

    def score(self, ctx: LayerContext) -> Tensor:
        raise TypeError("FullKV keeps everything: the engine never scores it")
