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
    tova,
)
from .base import ALL_PROMPT, AttentionScoredMethod, LayerContext, Method, Observation, param
from .registry import available, build, method_class, register

__all__ = ["ALL_PROMPT", "AttentionScoredMethod", "LayerContext", "Method", "Observation", "available", "build",
           "method_class", "param", "register"]
