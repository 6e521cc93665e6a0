"""Prompt encoding, sampling, stopping, and the generate APIs over a compressed cache.

The decode steps themselves (original positions, logical masks, per-layer masks for layouts a
single mask cannot describe) are :class:`~dapq.decoding.DecodeStepper`'s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .cache import clone_cache
from .compress import compress, make_batch, prefill
from .decoding import DecodeStepper, resolve_decode
from .errors import ConfigError, DapqError
from .methods import build
from .methods.base import Method
from .prompts import encode_prompts, eos_token_ids, pad_token_id
from .state import PrefillResult


@dataclass
class SamplingConfig:
    """How new tokens are chosen, how the decode stores them, and when generation stops.

    Parameters
    ----------
    max_new_tokens : int
        Upper bound on generated tokens per prompt.
    do_sample : bool
        Greedy when False.
    temperature, top_k, top_p : float, int, float
        Sampling filters (only with ``do_sample``).
    seed : int
        Seed of the sampler.
    stop : tuple of str
        Stop strings; the text is cut before the first one.
    decode : {"auto", "static", "eager"}
        How the decode stores new keys and values (:data:`dapq.decoding.DECODE_MODES`): written
        in place into buffers sized once (``static``, the default) or concatenated per step
        (``eager``). The tokens are the same.
    """

    max_new_tokens: int = 64
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    decode: str = "auto"

    def __post_init__(self) -> None:
        self.decode = resolve_decode(self.decode)
        if self.max_new_tokens < 1:
            raise ConfigError("max_new_tokens must be >= 1")
        if self.temperature <= 0:
            raise ConfigError("temperature must be > 0")
        if not 0 < self.top_p <= 1:
            raise ConfigError("top_p must lie in (0, 1]")
        self.stop = tuple(self.stop)


@dataclass
class GenerationResult:
    """One prompt's output and the figures of the batch it ran in."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    method: str
    budget: int | None
    kept_tokens_per_head: list[int]
    kv_bytes_full: int
    kv_bytes_kept: int
    prefill_s: float
    compress_s: float
    decode_s: float
    decode_tokens_per_s: float
    finish_reason: str
    config: dict = field(default_factory=dict)
    question_tokens: int = 0
    """Context-only compression: tokens of the question fed after the compressed context."""
    question_s: float = 0.0
    """Seconds of the question block's forward over the compressed context: one batched forward,
    so every row of a batch reports the same time (as ``decode_s``)."""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def check_token_rows(model, rows: Sequence[Sequence[int]], what: str = "prompt") -> list[list[int]]:
    """Token-id rows as lists, or a :class:`DapqError` naming what is wrong with them."""
    if isinstance(rows, str | bytes) or not isinstance(rows, Sequence) or not rows:
        raise DapqError(f"give at least one {what}")
    vocab = model.config.vocab_size
    out = []
    for i, row in enumerate(rows):
        if isinstance(row, str | bytes) or not isinstance(row, Sequence):
            raise DapqError(f"{what} {i}: token ids must be a list of integers, got {type(row).__name__}")
        row = list(row)
        if not row:
            raise DapqError(f"{what} {i} has no tokens")
        bad = next((t for t in row if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise DapqError(f"{what} {i}: token id {bad!r} is not in the model's vocabulary [0, {vocab})")
        out.append(row)
    return out


def _choose(logits: Tensor, cfg: SamplingConfig, gen: torch.Generator | None) -> Tensor:
    if not cfg.do_sample:
        return logits.argmax(dim=-1)
    logits = logits / cfg.temperature
    if cfg.top_k:
        kth = logits.topk(min(cfg.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cum - sorted_logits.softmax(dim=-1) > cfg.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(-1).to(logits.device)


@torch.no_grad()
def decode(model, tokenizer, state: PrefillResult, cfg: SamplingConfig) -> tuple[list[list[int]], list[str], float]:
    """Generate from a compressed cache. Returns token ids, finish reasons and decode seconds."""
    with DecodeStepper(model, state, cfg.max_new_tokens, decode=cfg.decode) as stepper:
        return sample_loop(model, tokenizer, stepper, state.logits, cfg)


@torch.no_grad()
def sample_loop(model, tokenizer, stepper: DecodeStepper, logits: Tensor, cfg: SamplingConfig
                ) -> tuple[list[list[int]], list[str], float]:
    """Choose tokens from ``logits`` (B, V) on, feeding each through ``stepper``; stop per row.

    Returns token ids, finish reasons and the seconds it took. The caller owns the stepper (and so
    decides what was fed before: nothing after a prefill, a question after a compressed context).
    """
    bsz = logits.shape[0]
    device = model.device
    eos = torch.tensor(sorted(eos_token_ids(model, tokenizer)) or [-1], device=device)
    gen = torch.Generator().manual_seed(cfg.seed) if cfg.do_sample else None
    out: list[list[int]] = [[] for _ in range(bsz)]
    reasons = ["length"] * bsz
    done = torch.zeros(bsz, dtype=torch.bool, device=device)
    filler = pad_token_id(tokenizer)
    _sync(device)
    start = time.perf_counter()
    for step in range(cfg.max_new_tokens):
        token = _choose(logits, cfg, gen)
        token = torch.where(done, torch.full_like(token, filler), token)
        for b in torch.nonzero(~done).flatten().tolist():
            out[b].append(int(token[b]))
        hit_eos = torch.isin(token, eos) & ~done
        for b in torch.nonzero(hit_eos).flatten().tolist():
            reasons[b] = "eos"
        done |= hit_eos
        if cfg.stop:
            for b in torch.nonzero(~done).flatten().tolist():
                if any(s in tokenizer.decode(out[b], skip_special_tokens=True) for s in cfg.stop):
                    reasons[b] = "stop"
                    done[b] = True
        if bool(done.all()) or step == cfg.max_new_tokens - 1:
            break
        logits = stepper(token)
    _sync(device)
    return out, reasons, time.perf_counter() - start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _text(tokenizer, ids: list[int], eos: set[int], stop: tuple[str, ...]) -> str:
    text = tokenizer.decode([t for t in ids if t not in eos], skip_special_tokens=True)
    cuts = [text.index(s) for s in stop if s in text]
    return text[: min(cuts)] if cuts else text


def generate(
    model,
    tokenizer,
    prompts: Sequence[str] | str,
    method: Method | str | None = None,
    sampling: SamplingConfig | None = None,
    *,
    chat: bool = False,
    answer_prefix: str | None = None,
    prompt_ids: Sequence[Sequence[int]] | None = None,
    **sampling_kwargs,
) -> list[GenerationResult]:
    """Compress-then-generate for a batch of prompts.

    Parameters
    ----------
    model, tokenizer
        A supported Hugging Face causal LM and its tokenizer.
    prompts : str or list of str
        The prompts; they run as one left-padded batch.
    method : Method or str, optional
        A method object or name (default ``"full"``).
    sampling : SamplingConfig, optional
        Decoding settings; keyword arguments such as ``max_new_tokens=32`` build one.
    chat, answer_prefix
        Wrap each prompt in the chat template, then append ``answer_prefix``.
    prompt_ids : list of list of int, optional
        Pre-tokenised prompts (skips encoding; ``prompts`` is then ignored).
    """
    if isinstance(prompts, str):
        prompts = [prompts]
    if isinstance(method, str) or method is None:
        method = build(method or "full")
    sampling = sampling or SamplingConfig(**sampling_kwargs)
    if prompt_ids is None and not prompts:
        raise DapqError("give at least one prompt")
    rows = check_token_rows(model, prompt_ids if prompt_ids is not None else encode_prompts(
        tokenizer, prompts, chat=chat, answer_prefix=answer_prefix))
    limit = getattr(model.config, "max_position_embeddings", None)
    longest = max(len(r) for r in rows)
    if limit is not None and longest + sampling.max_new_tokens > limit:
        raise DapqError(
            f"prompt of {longest} tokens + {sampling.max_new_tokens} new tokens exceeds the model's context of {limit}"
        )
    start = time.perf_counter()
    batch = make_batch(model, method, rows, pad_id=pad_token_id(tokenizer), tokenizer=tokenizer)
    batch_s = time.perf_counter() - start  # the oracle's first decoding pass happens here
    state = prefill(model, method, batch)
    state.stats.prefill_s += batch_s
    ids, reasons, decode_s = decode(model, tokenizer, state, sampling)
    stats = state.stats
    return _results(model, tokenizer, state, [method] * len(rows), rows, ids, reasons, decode_s, sampling,
                    prefill_s=[stats.prefill_s] * len(rows), compress_s=[stats.compress_s] * len(rows))


def _results(model, tokenizer, state: PrefillResult, methods: Sequence[Method], rows, ids, reasons, decode_s: float,
             sampling: SamplingConfig, *, prefill_s: Sequence[float], compress_s: Sequence[float]):
    """One :class:`GenerationResult` per row of a decoded batch."""
    eos = eos_token_ids(model, tokenizer)
    n_new = sum(len(r) for r in ids)
    keys = state.cache.layers[0].keys
    # Per-prompt figures: the bytes this prompt's own tokens take, padding slots excluded.
    token_bytes = 2 * keys.shape[1] * keys.shape[3] * keys.element_size()
    results = []
    for b, row in enumerate(ids):
        kept = [layer.kept_tokens(b) for layer in state.cache.layers]
        results.append(
            GenerationResult(
                text=_text(tokenizer, row, eos, sampling.stop),
                token_ids=row,
                prompt_tokens=len(rows[b]),
                method=methods[b].name,
                budget=methods[b].budget,
                kept_tokens_per_head=kept,
                kv_bytes_full=token_bytes * len(rows[b]) * len(kept),
                kv_bytes_kept=token_bytes * sum(kept),
                prefill_s=prefill_s[b],
                compress_s=compress_s[b],
                decode_s=decode_s,
                decode_tokens_per_s=n_new / decode_s if decode_s > 0 else 0.0,
                finish_reason=reasons[b],
                config=methods[b].config(),
            )
        )
    return results


@torch.no_grad()
def generate_many(
    model,
    tokenizer,
    prompt_ids: Sequence[int],
    methods: Sequence[Method],
    sampling: SamplingConfig | None = None,
    *,
    max_batch: int = 8,
    question_ids: Sequence[int] | None = None,
    **sampling_kwargs,
) -> list[GenerationResult]:
    """Every method on one prompt, at the cost of one prefill: what accuracy sweeps need.

    The prompt is prefilled once with FullKV; each method then compresses a copy of that cache
    with :func:`~dapq.compress.compress` (which replays only the queries the method needs: the
    N pseudo tokens for DapQ, the last W prompt tokens for SnapKV, nothing for StreamingLLM).
    Causality makes every kept K/V and the first-token logits the same as in the method's own
    prefill, so each row's output equals :func:`generate` with that method, up to float
    rounding. The compressed caches with equal per-layer widths are then decoded together, up
    to ``max_batch`` rows at a time.

    With ``question_ids``, ``prompt_ids`` is a context and only it is compressed: the question is
    then fed uncompressed after each method's compressed context, and the first new token comes
    from its last logits (context-only compression, :mod:`dapq.context`; each row equals
    :func:`~dapq.context.ask` with that method).

    ``prefill_s`` of every result is the shared FullKV prefill plus the method's own replay;
    for per-method timings use ``dapq bench speed``.
    """
    sampling = sampling or SamplingConfig(**sampling_kwargs)
    if max_batch < 1:
        raise ConfigError("max_batch must be >= 1")
    row = check_token_rows(model, [prompt_ids])[0]
    question = check_token_rows(model, [question_ids], "question")[0] if question_ids else []
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and len(row) + len(question) + sampling.max_new_tokens > limit:
        raise DapqError(f"prompt of {len(row) + len(question)} tokens + {sampling.max_new_tokens} new tokens "
                        f"exceeds the model's context of {limit}")
    full = build("full")
    base = prefill(model, full, make_batch(model, full, [row], pad_id=pad_token_id(tokenizer)))
    input_ids = base.batch.input_ids
    states, prefill_s, compress_s = [], [], []
    for method in methods:
        start = time.perf_counter()
        state = compress(model, clone_cache(base.cache), method, input_ids, tokenizer=tokenizer)
        replay = time.perf_counter() - start - state.stats.compress_s
        # The first new token comes from the logits at Lp-1, the same for every method.
        states.append(PrefillResult(state.cache, base.logits, state.batch))
        prefill_s.append(base.stats.prefill_s + replay)
        compress_s.append(state.stats.compress_s)
    results: list[GenerationResult | None] = [None] * len(methods)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, state in enumerate(states):
        groups.setdefault(tuple(state.cache.kept_per_layer()), []).append(i)
    for members in groups.values():
        for start in range(0, len(members), max_batch):
            chunk = members[start : start + max_batch]
            stacked = PrefillResult.stack([states[i] for i in chunk])
            with DecodeStepper(model, stacked, len(question) + sampling.max_new_tokens,
                               decode=sampling.decode) as stepper:
                start = time.perf_counter()
                logits = stepper.extend(torch.tensor([question] * len(chunk), device=model.device)) if question \
                    else stacked.logits
                _sync(model.device)
                question_s = time.perf_counter() - start
                ids, reasons, decode_s = sample_loop(model, tokenizer, stepper, logits, sampling)
            out = _results(model, tokenizer, stacked, [methods[i] for i in chunk], [row] * len(chunk), ids, reasons,
                           decode_s, sampling, prefill_s=[prefill_s[i] for i in chunk],
                           compress_s=[compress_s[i] for i in chunk])
            for i, result in zip(chunk, out, strict=True):
                result.question_tokens, result.question_s = len(question), question_s if question else 0.0
                results[i] = result
    return results
