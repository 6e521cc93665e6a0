"""Compress once, ask many: context-only compression.

A long context (a document, a code base, a chat history) is prefilled and compressed **once**
with any method; questions that were not known at compression time are then answered from the
same compressed cache. This is kvpress's "question not seen" setting. The DapQ paper (Tian et
al., 2026) compresses the whole prompt, question included; context-only compression is where its
idea should matter most, since DapQ's pseudo queries sit at the positions that follow the context
and need no question, while SnapKV's observation window then holds the end of the document.

How a question is answered. The compressed context keeps its logical positions: row ``b`` holds
``Lc_b`` context tokens, evicted ones included. The question's tokens are fed uncompressed after
it, at positions ``Lc_b, Lc_b + 1, ...``, and the answer is decoded after them. Every question is
answered on its own copy of its context's compressed row (:meth:`CompressedCache.select`), one
batch row per question, so answering one question never changes what the next one sees, and the
context's cache is never written. The result equals evicting the context part only of the
sequence (context, question) and decoding over the full cache with those keys masked
(``tests/test_context.py``).

With a chat template the user turn is split: the context part is the template's opening plus the
context, the question part is the question, the template's closing and generation prompt, and the
answer prefix. The split is taken at a separator rendered inside the user message, so it holds
for any template that copies the message verbatim.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .compress import make_batch, prefill
from .decoding import DecodeStepper
from .errors import DapqError
from .generation import (
    GenerationResult,
    SamplingConfig,
    _results,
    check_token_rows,
    pad_token_id,
    sample_loop,
)
from .methods import build
from .methods.base import Method
from .models import model_fingerprint
from .prompts import encode_context, encode_question
from .state import PrefillResult


@dataclass
class CompressedContext:
    """Contexts prefilled and compressed once, ready for any number of questions.

    ``state`` holds one batch row per context; ``context_ids`` their token ids.
    """

    state: PrefillResult
    method: Method
    context_ids: list[list[int]]
    chat: bool
    model: dict = field(default_factory=dict)
    """The fingerprint of the model that made it (:func:`dapq.models.model_fingerprint`): a cache
    is only meaningful to the weights and dtype that wrote it."""

    def check_model(self, model) -> None:
        """Refuse a model other than the one that compressed these contexts."""
        theirs = model_fingerprint(model)
        if self.model and theirs != self.model:
            diff = ", ".join(f"{k} {self.model.get(k)!r} vs {v!r}" for k, v in theirs.items() if self.model.get(k) != v)
            raise DapqError(f"this context was compressed by another model ({diff}); compress it again with this one")

    @property
    def n_contexts(self) -> int:
        return len(self.context_ids)


@torch.no_grad()
def compress_context(model, tokenizer, contexts: Sequence[str] | str, method: Method | str | None = None, *,
                     chat: bool = False, context_ids: Sequence[Sequence[int]] | None = None) -> CompressedContext:
    """Prefill and compress contexts once (one left-padded batch), for :func:`ask`.

    Parameters
    ----------
    model, tokenizer
        A supported causal LM and its tokenizer.
    contexts : str or list of str
        The contexts; ignored when ``context_ids`` is given.
    method : Method or str, optional
        Any registered method (default ``"full"``); its budget applies to each context.
    chat : bool
        The contexts open a chat user turn that the questions close (:class:`ChatSplit`).
    context_ids : list of list of int, optional
        Pre-tokenised contexts (:func:`encode_context`).
    """
    if isinstance(contexts, str):
        contexts = [contexts]
    if isinstance(method, str) or method is None:
        method = build(method or "full")
    if context_ids is None and not contexts:
        raise DapqError("give at least one context")
    rows = check_token_rows(model, context_ids if context_ids is not None
                            else [encode_context(tokenizer, c, chat=chat) for c in contexts], "context")
    start = time.perf_counter()
    batch = make_batch(model, method, rows, pad_id=pad_token_id(tokenizer), tokenizer=tokenizer)
    batch_s = time.perf_counter() - start
    state = prefill(model, method, batch)
    state.stats.prefill_s += batch_s
    return CompressedContext(state=state, method=method, context_ids=rows, chat=chat, model=model_fingerprint(model))


def question_block(rows: Sequence[Sequence[int]], pad_id: int, device) -> tuple[Tensor, Tensor]:
    """Left-pad token rows into ``(ids, valid)`` (B, T): padding leads, so the last column is real."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)
    valid = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    for b, row in enumerate(rows):
        ids[b, width - len(row):] = torch.tensor(row, dtype=torch.long, device=device)
        valid[b, width - len(row):] = 1
    return ids, valid


@torch.no_grad()
def answer(model, tokenizer, state: PrefillResult, question_ids: Sequence[Sequence[int]], cfg: SamplingConfig
           ) -> tuple[list[list[int]], list[str], float, float]:
    """Feed one question per row of ``state`` after its compressed context, then decode.

    ``state``'s cache receives the question and answer tokens: pass a copy (the caller's
    :meth:`~dapq.cache.CompressedCache.select`). Returns token ids, finish reasons, the seconds
    of the question forward and of decoding.
    """
    rows = state.batch.prompt_lengths.shape[0]
    if len(question_ids) != rows:
        raise DapqError(f"{len(question_ids)} questions for {rows} context rows")
    ids, valid = question_block(question_ids, pad_token_id(tokenizer), model.device)
    with DecodeStepper(model, state, ids.shape[1] + cfg.max_new_tokens, decode=cfg.decode) as stepper:
        start = time.perf_counter()
        logits = stepper.extend(ids, valid)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        question_s = time.perf_counter() - start
        out, reasons, decode_s = sample_loop(model, tokenizer, stepper, logits, cfg)
    return out, reasons, question_s, decode_s


@torch.no_grad()
def ask(model, tokenizer, ctx: CompressedContext, questions: Sequence[str] | str, *,
        rows: Sequence[int] | None = None, answer_prefix: str | None = None, sampling: SamplingConfig | None = None,
        question_ids: Sequence[Sequence[int]] | None = None, max_batch: int = 8,
        **sampling_kwargs) -> list[GenerationResult]:
    """Answer questions from compressed contexts; the contexts are left as they were.

    Parameters
    ----------
    ctx : CompressedContext
        From :func:`compress_context`.
    questions : str or list of str
        The questions; ignored when ``question_ids`` is given.
    rows : list of int, optional
        The context each question is asked of. By default every question goes to the only
        context, or question ``i`` to context ``i`` when there are as many questions as contexts.
    answer_prefix : str, optional
        Text after the question (and after the chat template's generation prompt).
    max_batch : int
        Questions decoded together.

    Returns one :class:`~dapq.generation.GenerationResult` per question, in order. Its
    ``prompt_tokens`` and KV bytes describe the context (what was compressed), ``question_tokens``
    the question fed after it uncompressed.
    """
    if not isinstance(ctx, CompressedContext):
        raise DapqError(f"ask() needs the CompressedContext that compress_context() returned, got {type(ctx).__name__}")
    ctx.check_model(model)
    if isinstance(questions, str):
        questions = [questions]
    sampling = sampling or SamplingConfig(**sampling_kwargs)
    if question_ids is None and not questions:
        raise DapqError("give at least one question")
    q_rows = ([list(q) for q in question_ids] if question_ids is not None else
              [encode_question(tokenizer, q, chat=ctx.chat, answer_prefix=answer_prefix) for q in questions])
    if any(isinstance(q, Sequence) and not isinstance(q, str) and not q for q in q_rows):
        raise DapqError("a question has no tokens: each one is fed after the context and needs at least one")
    q_rows = check_token_rows(model, q_rows, "question")
    if rows is None:
        if ctx.n_contexts == 1:
            rows = [0] * len(q_rows)
        elif len(q_rows) == ctx.n_contexts:
            rows = list(range(len(q_rows)))
        else:
            raise DapqError(f"{len(q_rows)} questions for {ctx.n_contexts} contexts: say which context each asks (rows=)")
    if max_batch < 1:
        raise DapqError(f"max_batch must be >= 1, got {max_batch}")
    rows = list(rows)
    if len(rows) != len(q_rows) or any(not 0 <= r < ctx.n_contexts for r in rows):
        raise DapqError(f"rows must give one context index in [0, {ctx.n_contexts}) per question")
    limit = getattr(model.config, "max_position_embeddings", None)
    for r, q in zip(rows, q_rows, strict=True):
        if limit is not None and len(ctx.context_ids[r]) + len(q) + sampling.max_new_tokens > limit:
            raise DapqError(f"context of {len(ctx.context_ids[r])} tokens + question of {len(q)} + "
                            f"{sampling.max_new_tokens} new tokens exceeds the model's context of {limit}")
    stats = ctx.state.stats
    results: list[GenerationResult] = []
    for start in range(0, len(q_rows), max_batch):
        chunk = rows[start : start + max_batch]
        questions_chunk = q_rows[start : start + max_batch]
        state = PrefillResult(ctx.state.cache.select(chunk), None, ctx.state.batch.select(chunk))
        ids, reasons, question_s, decode_s = answer(model, tokenizer, state, questions_chunk, sampling)
        out = _results(model, tokenizer, state, [ctx.method] * len(chunk), [ctx.context_ids[r] for r in chunk],
                       ids, reasons, decode_s, sampling, prefill_s=[stats.prefill_s] * len(chunk),
                       compress_s=[stats.compress_s] * len(chunk))
        for result, q in zip(out, questions_chunk, strict=True):
            result.question_tokens = len(q)
            result.question_s = question_s
        results.extend(out)
    return results
