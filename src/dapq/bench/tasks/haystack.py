"""Haystack text for the generated task sets: shipped prose (``src/dapq/data``) or RULER's noise."""

from __future__ import annotations

import re
from importlib import resources

from ...errors import DapqError

# RULER's "noise" haystack: repeated filler that carries no information.
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def haystack_text(name: str) -> str:
    """A shipped haystack (``essays``, ``held_out``), or ``noise`` (RULER's repeated filler)."""
    if name == "noise":
        return NOISE
    files = {"essays": "haystack_essays.txt", "held_out": "haystack_held_out.txt"}
    if name not in files:
        raise DapqError(f"unknown haystack {name!r}; choose from noise, {', '.join(files)}")
    return resources.files("dapq.data").joinpath(files[name]).read_text(encoding="utf-8")


def sentences(text: str) -> list[str]:
    """Split prose into sentences (each with a trailing space) for sizing and insertion."""
    return [s + " " for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]
