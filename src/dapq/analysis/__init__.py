"""Analyses of the DapQ paper as tools: ground-truth decoding queries and what they attend to."""

from .decode import DecodeTrace, capture_pseudo_queries, trace_decode
from .measures import cosine, keep_recall

__all__ = ["DecodeTrace", "capture_pseudo_queries", "cosine", "keep_recall", "trace_decode"]
