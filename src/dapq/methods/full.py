"""FullKV: the uncompressed reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Method
from .registry import register


@register
@dataclass
class FullKV(Method):
    """Keep every prompt token. The accuracy ceiling and the speed/memory baseline."""

    name: ClassVar[str] = "full"
    paper: ClassVar[str] = "-"

    @property
    def evicts(self) -> bool:
        return False
