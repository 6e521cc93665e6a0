"""dapq: KV-cache compression for Hugging Face causal LMs.

DapQ (position-aware pseudo queries, Tian et al. 2026) next to FullKV, SnapKV, PyramidKV, H2O,
StreamingLLM, LaCache and a random floor, as real one-shot eviction after prefill; plus two
decoding-aligned variants (``dapq_hybrid``, ``deferkv``) and an analysis-only oracle.

>>> import dapq
>>> model, tok = dapq.load_model()                       # embedded SmolLM2-135M-Instruct
>>> method = dapq.build("dapq", budget=128)
>>> out = dapq.generate(model, tok, ["..."], method, max_new_tokens=32)
>>> out[0].text, out[0].kv_bytes_kept / out[0].kv_bytes_full
"""

from .cache import CompressedCache, CompressedLayer
from .compress import compress, make_batch, prefill
from .context import CompressedContext, ask, compress_context
from .errors import ConfigError, DapqError, UnsupportedModelError
from .generation import GenerationResult, SamplingConfig, decode, generate, generate_many
from .methods import Method, Observation, available, build
from .models import SUPPORTED_MODEL_TYPES, load_model
from .prompts import encode_prompts
from .state import PrefillResult, PromptBatch

__version__ = "0.1.0"

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "CompressedCache",
    "CompressedContext",
    "CompressedLayer",
    "ConfigError",
    "DapqError",
    "GenerationResult",
    "Method",
    "Observation",
    "PrefillResult",
    "PromptBatch",
    "SamplingConfig",
    "UnsupportedModelError",
    "ask",
    "available",
    "build",
    "compress",
    "compress_context",
    "decode",
    "encode_prompts",
    "generate",
    "generate_many",
    "load_model",
    "make_batch",
    "prefill",
]
