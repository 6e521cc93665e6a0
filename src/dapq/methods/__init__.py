"""Compression methods, one module each, registered by name.

>>> from dapq.methods import build
>>> build("snapkv", budget=128).window
8
"""

from . import (  # noqa: F401
    dapq,
    dapq_hybrid,
    deferkv,
    full,
    h2o,
    lacache,
    oracle,
    pyramidkv,
    random_keep,
    snapkv,
    streamingllm,
)
from .base import AttentionScoredMethod, LayerContext, Method
from .registry import available, build, method_class, register

__all__ = ["AttentionScoredMethod", "LayerContext", "Method", "available", "build", "method_class", "register"]
