"""Timed samples: what the speed benchmark and the kvpress speed child report (a leaf module)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class Timing:
    """Samples of one timed quantity (seconds) with their median and spread."""

    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def spread(self) -> tuple[float, float]:
        return (min(self.samples), max(self.samples)) if self.samples else (float("nan"), float("nan"))

    def to_dict(self) -> dict:
        lo, hi = self.spread
        return {"median": self.median, "min": lo, "max": hi, "samples": list(self.samples)}
