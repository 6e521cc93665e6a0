"""DapQ: decoding-aligned KV cache compression with position-aware pseudo queries.

Tian, Su, Li, Zhang, "Where Matters More Than What: Decoding-aligned KV Cache Compression via
Position-aware Pseudo Queries", arXiv 2603.11564 (2026), Figure 1.

The prompt (length Lp) is extended by N pseudo tokens whose position ids are Lp+o .. Lp+o+N-1,
the positions the first N decoded tokens will have. One prefill runs over the extended sequence;
at every layer the pseudo tokens' queries score the prompt keys, the top-K prompt tokens per KV
head are kept and every pseudo token is evicted. Decoding resumes at position Lp with the first
token taken from the logits at Lp-1: causality makes the prompt's K/V and that logit identical to
a plain prefill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import ConfigError
from .base import NORMALIZE, AttentionScoredMethod, Observation, param
from .registry import register

CONTENTS = ("prefix_suffix", "random_sample", "random_span", "random_vocab", "fixed", "text", "tokens")
DEFAULT_FIXED_TEXT = "Sorry, I don't know. "

# Table 10 of the paper: first 8 + last 24 prompt tokens for Llama models, 2 + 30 for Qwen.
_PREFIX_SHARE = {"qwen2": 2 / 32, "qwen3": 2 / 32}
_DEFAULT_PREFIX_SHARE = 8 / 32


@register
@dataclass
class DapQ(AttentionScoredMethod):
    """DapQ with every open choice of the paper exposed as a parameter.

    The defaults are the paper's recipe except the pseudo content: ``fixed`` ("Sorry, I don't
    know." repeated, the paper's Fix_C) won the ablation on the embedded model where the paper's
    first 8 + last 24 prompt tokens came last but one (docs/results/tuning). ``preset="paper"``
    restores the paper's content; ``preset="context"`` is the variant measured best with the
    question unseen. Text contents need the tokenizer (``generate`` passes it).

    Parameters
    ----------
    n_pseudo : int
        N, the number of pseudo tokens (32 in the paper): the pseudo queries' observation window.
    content : str
        Pseudo-token content (paper Figure 4a / Table 10):
        ``prefix_suffix`` (Fm_Ln: first m + last n prompt tokens), ``random_sample`` (RS_C: N
        context tokens sampled at random, in order), ``random_span`` (RC_C: a random contiguous
        span), ``random_vocab`` (N random vocabulary ids), ``fixed`` (Fix_C: a fixed text,
        "Sorry, I don't know." repeated), ``text`` (the user's ``text``, repeated to N tokens) or
        ``tokens`` (explicit ``token_ids``, used by the analyses).
    prefix, suffix : int, optional
        m and n of ``prefix_suffix``; by default 8 + 24 scaled to N (2 + 30 for Qwen models).
    text : str, optional
        Text for ``fixed`` and ``text`` content.
    token_ids : tuple of int, optional
        Ids for ``tokens`` content.
    position_offset : int
        The pseudo positions start at Lp + offset (paper Figure 4c; default 0).
    inside_part : int, optional
        1, 2 or 3: place the pseudo positions at the start of that third of [0, Lp) instead, the
        paper's "inside the context" ablation.
    keep_recent : int
        Last prompt tokens always kept (0 in the paper's recipe).
    normalize : {"prompt", "all"}
        Softmax over the prompt keys only, or over prompt plus (causally visible) pseudo keys.
    seed : int
        Seed of the random content strategies.

    ``layer_budget="pyramid"`` (every method's option) gives PyramidKV's schedule with the same
    mean, ``keep_recent`` playing the part of its window.
    """

    name: ClassVar[str] = "dapq"
    paper: ClassVar[str] = "DapQ (Tian et al., 2026)"
    window_param: ClassVar[str] = "n_pseudo"
    #: ``paper`` is the recipe of the paper (Figure 1, Table 10): N = 32 pseudo tokens, first 8 +
    #: last 24 prompt tokens (2 + 30 for Qwen), positions Lp.., top-K of the pseudo queries'
    #: attention and nothing else kept; the choices it leaves open are set as in SnapKV (max-pool
    #: 7, sum, GQA mean).
    presets: ClassVar[dict[str, dict]] = {
        "paper": dict(n_pseudo=32, content="prefix_suffix", prefix=None, suffix=None, position_offset=0,
                      inside_part=None, keep_recent=0, normalize="prompt", layer_budget="flat", kernel=7,
                      pooling="max", query_reduce="sum", group_reduce="mean"),
        # ``context`` is for compressing a context before its questions are known (``--compress
        # context``): the pseudo positions 64 past the context's end, where a question after it
        # would sit, and one ranking per layer as TOVA keeps. Chosen on RULER-4k seed 2 and checked
        # on seed 1 (docs/results/large-sets/variants-tuning); prompt mode was not re-measured.
        "context": dict(position_offset=64, group_reduce="layer"),
    }

    n_pseudo: int = param(32, ge=1)
    content: str = param("fixed", choices=CONTENTS)
    prefix: int | None = param(None, ge=0)
    suffix: int | None = param(None, ge=0)
    text: str | None = param(None)
    token_ids: tuple[int, ...] | None = param(None)
    position_offset: int = param(0, ge=0)
    inside_part: int | None = param(None, choices=(1, 2, 3))
    keep_recent: int = param(0, ge=0)
    normalize: str = param("prompt", choices=NORMALIZE)
    seed: int = param(0, ge=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.prefix is None) != (self.suffix is None):
            raise ConfigError("give both prefix and suffix, or neither")
        if self.prefix is not None and self.prefix + self.suffix != self.n_pseudo:
            raise ConfigError(f"prefix + suffix must equal n_pseudo ({self.n_pseudo})")
        if self.content == "text" and not self.text:
            raise ConfigError("content 'text' needs a non-empty text")
        if self.content == "tokens" and not self.token_ids:
            raise ConfigError("content 'tokens' needs token_ids")
        if self.token_ids and min(self.token_ids) < 0:
            raise ConfigError("token_ids must be non-negative token ids")

    def observation(self) -> Observation:
        return Observation(pseudo_tokens=self.n_pseudo, keep_recent=self.keep_recent)

    # --------------------------------------------------------------- pseudo context
    def split(self, model_type: str) -> tuple[int, int]:
        """(m, n) of the Fm_Ln content for this model family."""
        if self.prefix is not None:
            return self.prefix, self.suffix
        m = round(self.n_pseudo * _PREFIX_SHARE.get(model_type, _DEFAULT_PREFIX_SHARE))
        return m, self.n_pseudo - m

    def pseudo_tokens(
        self, prompt_ids: list[int], *, vocab_size: int, model_type: str, tokenizer=None, model=None
    ) -> list[int]:
        """The N pseudo-token ids for one prompt. Deterministic for (seed, prompt)."""
        n = self.n_pseudo
        gen = torch.Generator().manual_seed(self.seed)
        length = len(prompt_ids)
        if self.content == "prefix_suffix":
            m, k = self.split(model_type)
            return _fit(prompt_ids[:m] + (prompt_ids[length - k :] if k else []), n)
        if self.content == "random_sample":
            if length >= n:
                idx = torch.randperm(length, generator=gen)[:n].sort().values
            else:
                idx = torch.randint(length, (n,), generator=gen).sort().values
            return [prompt_ids[i] for i in idx.tolist()]
        if self.content == "random_span":
            start = int(torch.randint(max(length - n, 0) + 1, (1,), generator=gen))
            return _fit(prompt_ids[start : start + n], n)
        if self.content == "random_vocab":
            return torch.randint(vocab_size, (n,), generator=gen).tolist()
        if self.content == "tokens":
            if max(self.token_ids) >= vocab_size:  # the vocabulary is known only now, with the model
                raise ConfigError(f"token_ids must lie below the model's vocabulary of {vocab_size}")
            return _fit(list(self.token_ids), n)
        if tokenizer is None:
            raise ConfigError(f"content {self.content!r} needs a tokenizer (pass tokenizer=...), or choose a "
                              f"content made of ids: prefix_suffix (preset='paper'), random_vocab, tokens")
        text = self.text or DEFAULT_FIXED_TEXT
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ConfigError("the pseudo-context text tokenizes to nothing")
        return _fit(ids, n)

    def pseudo_positions(self, prompt_len: int) -> list[int]:
        """Position ids of the pseudo tokens: Lp + offset .. (or inside the context)."""
        if self.inside_part is not None:
            start = (self.inside_part - 1) * prompt_len // 3
        else:
            start = prompt_len + self.position_offset
        return list(range(start, start + self.n_pseudo))


def _fit(ids: list[int], n: int) -> list[int]:
    """Repeat or truncate ``ids`` to exactly n tokens."""
    if not ids:
        raise ConfigError("empty pseudo context")
    reps = -(-n // len(ids))
    return (ids * reps)[:n]
