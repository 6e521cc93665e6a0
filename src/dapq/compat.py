"""Every difference between the transformers 5.x releases dapq supports, in one module.

dapq works on transformers 5.2.0 through the newest 5.x release. The engine never asks which
release it runs on: each difference below is *detected* (the signature of a forward, the
presence of a method) and answered here, so the rest of dapq reads as if there were one
transformers. Positions stay explicit everywhere (``position_ids`` on every call, gpt-fast
style); nothing infers a position from a cache length.

What changed, and in which release (read off the released wheels' sources, 5.2.0 to 5.25.0):

=============================================  ===========  ======================================
Change                                         Release      What dapq does
=============================================  ===========  ======================================
Forwards take ``cache_position``               5.2 - 5.3    :func:`forward` passes it only where
(gone from 5.4; extra kwargs are absorbed)                  the model's forward declares it
``Cache.get_mask_sizes(cache_position, l)``    5.2 - 5.3    ``CompressedLayer.get_mask_sizes``
becomes ``get_mask_sizes(query_length, l)``    5.4          reads it with :func:`query_length`
Mask query offset: ``cache_position[0]``       5.2 - 5.3    ``CompressedLayer`` answers all three
then ``cache.get_seq_length()``                5.4 - 5.13   with the logical length (physical +
then ``cache.get_query_offset(layer_idx)``     5.14         evicted), the same in every layer
``get_max_cache_shape`` -> ``get_max_length``  5.13         not used
``DynamicLayer.crop(n)`` with ``n > 0``        5.15 - 5.19  :func:`truncate` slices the tensors;
warns, then raises; it takes ``-n_removed``    5.20         dapq never calls ``crop``
Attention layers get the cache as ``cache=``   5.24         :func:`layer_cache` reads the keyword
(was ``past_key_values=``); model forwards     5.24         the module's forward declares;
take ``cache=`` (old name: FutureWarning)                   :func:`forward` passes the declared one
Registered attention implementations           every        :func:`attention_implementations`
(``flash_attention_4`` from 5.25, no                        asks the installed release
``paged|sdpa`` from 5.23)
GGUF tokenizer conversion: the saved           5.17 -       :func:`tokenizer_round_trips` checks
tokenizer loses its ByteLevel decoder                       it; embedded.py re-converts (see there)
=============================================  ===========  ======================================

``CompressedLayer`` keeps one meaning in every release: the *logical* length (what positions
and the mask's query offset need) from ``get_seq_length``/``get_query_offset``, the *physical*
length of each layer for the mask's key axis, and the evicted slots as the mask's ``kv_offset``.
"""

from __future__ import annotations

import inspect
from functools import cache

import torch

#: A short text whose decoding exercises byte-level BPE: leading spaces, a newline, quotes.
_ROUND_TRIP_TEXT = 'Hello world, the "blue" sky.\nNext line: 1234.'


@cache
def _parameters(fn) -> frozenset[str]:
    # inspect.signature follows __wrapped__, so the deprecate_kwarg decorator (5.24+) shows the
    # real parameters of the forward it wraps.
    return frozenset(inspect.signature(fn).parameters)


def _takes(module_or_cls, name: str) -> bool:
    cls = module_or_cls if isinstance(module_or_cls, type) else type(module_or_cls)
    return name in _parameters(cls.forward)


def cache_keyword(module) -> str:
    """The keyword under which ``module.forward`` takes the KV cache: ``cache`` (5.24+) or ``past_key_values``."""
    return "cache" if _takes(module, "cache") else "past_key_values"


def cache_kwargs(model, cache) -> dict:
    """``{keyword: cache}`` for ``model(...)`` or ``model.generate(...)`` in the installed release.

    >>> model.generate(ids, attention_mask=mask, **compat.cache_kwargs(model, state.cache))
    """
    return {cache_keyword(model): cache}


def layer_cache(attn: torch.nn.Module, kwargs: dict):
    """The cache object an attention module received, from its forward-hook ``kwargs``."""
    return kwargs[cache_keyword(attn)]


def forward(model, input_ids, *, position_ids, cache, first_column: int, attention_mask=None, **extra):
    """One forward of ``model`` over ``cache`` with explicit positions, in any supported release.

    Parameters
    ----------
    input_ids, position_ids : Tensor
        (B, Q) ids of the new columns and their RoPE positions.
    cache : Cache
        Holds the columns before ``first_column`` (logically; a compressed cache holds fewer).
    first_column : int
        Logical index of the first new column: the ``cache_position`` of releases that take one.
    attention_mask : Tensor, optional
        (B, first_column + Q) *logical* 2-D mask of every column so far; None when nothing is padded.
    **extra
        Passed through (``use_cache``, ``logits_to_keep``, ...).
    """
    kwargs = {**cache_kwargs(model, cache), "use_cache": True, **extra}
    if _takes(model, "cache_position"):
        kwargs["cache_position"] = torch.arange(first_column, first_column + input_ids.shape[1],
                                                device=input_ids.device)
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)


def query_length(query) -> int:
    """The query length a cache layer's ``get_mask_sizes`` was given: a ``cache_position`` tensor (to 5.3) or an int."""
    return query if isinstance(query, int) else int(query.shape[0])


def truncate(layer, length: int) -> None:
    """Keep the first ``length`` slots of a cache layer (``crop``'s meaning changed twice; see the table)."""
    layer.keys = layer.keys[..., :length, :]
    layer.values = layer.values[..., :length, :]


def truncate_cache(cache, length: int) -> None:
    """Keep the first ``length`` slots of every layer of a cache."""
    for layer in cache.layers:
        truncate(layer, length)


def attention_implementations() -> tuple[str, ...]:
    """The ``--attn`` values dapq can serve with the installed transformers.

    ``eager`` and ``sdpa`` always; each ``flash_attention_*`` that this release registers (they
    need CUDA and the flash-attn package). Flex and paged attention take other mask formats than
    the 2-D / 4-D masks dapq's per-layer masks produce, so they are left out.
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    flash = sorted(k for k in ALL_ATTENTION_FUNCTIONS.valid_keys() if k.startswith("flash_attention_"))
    return ("eager", "sdpa", *flash)


def tokenizer_round_trips(tokenizer) -> bool:
    """True when ``decode(encode(text))`` gives the text back.

    The GGUF conversion of 5.17 and later saves a byte-level BPE tokenizer whose ``tokenizer.json``
    has no ByteLevel decoder, so decoded text keeps the raw ``Ġ``/``Ċ`` markers. A model directory
    whose tokenizer fails this is not fit to serve.
    """
    ids = tokenizer(_ROUND_TRIP_TEXT, add_special_tokens=False)["input_ids"]
    return tokenizer.decode(ids, skip_special_tokens=True) == _ROUND_TRIP_TEXT
