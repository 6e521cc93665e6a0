"""Context-only compression: compress a context once, answer many questions from it."""

from __future__ import annotations

import pytest
import torch

from dapq.compress import PrefillResult
from dapq.context import answer, ask, compress_context
from dapq.decoding import DecodeStepper
from dapq.generation import SamplingConfig, generate_many
from dapq.methods import available, build
from dapq.prompts import ChatSplit, encode_context, encode_question

from conftest import TOKENIZER, random_prompt
from helpers import hf_greedy, masked_reference_logits

EVICTING = [n for n in available() if n not in ("full", "oracle")]
CONTEXT = random_prompt(60, seed=11)
QUESTION = random_prompt(7, seed=12)


def _compressed_then_question_logits(model, method, context, question, tokens):
    ctx = compress_context(model, TOKENIZER, [], method, context_ids=[context])
    state = PrefillResult(ctx.state.cache.select([0]), None, ctx.state.batch.select([0]))
    with DecodeStepper(model, state, len(question) + len(tokens)) as stepper:
        first = stepper.extend(torch.tensor([question]))
        rest = [stepper(torch.tensor([tok])) for tok in tokens]
    return ctx, torch.cat([first, *rest])


@pytest.mark.parametrize("name", EVICTING)
def test_question_after_compressed_context_equals_masked_full_cache(llama_eager, name):
    """Evicting the context part only of (context, question), then decoding: the masked reference."""
    method = build(name, budget=16)
    tokens = random_prompt(5, seed=13)
    ctx, ours = _compressed_then_question_logits(llama_eager, method, CONTEXT, QUESTION, tokens)
    assert ctx.state.cache.kept_per_layer() != [len(CONTEXT)] * 4  # something was evicted
    ref = masked_reference_logits(llama_eager, CONTEXT, ctx.state.cache, tokens, question=QUESTION)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


def test_question_after_a_head_wise_context_equals_masked_full_cache(llama_eager):
    """Heads that keep different counts of the context: the question and answer see each head's own keys."""
    method = build("dapq", budget=16, head_budget="adaptive")
    tokens = random_prompt(5, seed=14)
    ctx, ours = _compressed_then_question_logits(llama_eager, method, CONTEXT, QUESTION, tokens)
    assert any(layer.head_wise for layer in ctx.state.cache.layers)
    ref = masked_reference_logits(llama_eager, CONTEXT, ctx.state.cache, tokens, question=QUESTION)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


def test_full_context_mode_is_plain_generation_of_context_then_question(llama):
    """No eviction: the answer is what transformers generates for the concatenated tokens."""
    ctx = compress_context(llama, TOKENIZER, [], "full", context_ids=[CONTEXT])
    out = ask(llama, TOKENIZER, ctx, [], question_ids=[QUESTION], max_new_tokens=8)[0]
    reference = hf_greedy(llama, CONTEXT + QUESTION, 8)
    assert out.token_ids == reference[: len(out.token_ids)] and len(out.token_ids) >= 1


@pytest.mark.parametrize("name", ["dapq", "snapkv", "pyramidkv", "deferkv"])
def test_batched_contexts_and_questions_equal_each_alone(llama, name):
    """Contexts of different lengths, questions of different lengths (padding inside the block)."""
    contexts = [random_prompt(n, seed=20 + n) for n in (64, 45)]
    questions = [random_prompt(n, seed=30 + n) for n in (3, 9)]
    method = build(name, budget=12)
    cfg = dict(max_new_tokens=6)
    ctx = compress_context(llama, TOKENIZER, [], method, context_ids=contexts)
    if name == "pyramidkv":
        assert not ctx.state.cache.canonical  # per-layer widths with padding: per-layer masks
    together = ask(llama, TOKENIZER, ctx, [], question_ids=questions, **cfg)
    for context, question, out in zip(contexts, questions, together, strict=True):
        alone = ask(llama, TOKENIZER, compress_context(llama, TOKENIZER, [], method, context_ids=[context]), [],
                    question_ids=[question], **cfg)[0]
        assert out.token_ids == alone.token_ids
        assert out.prompt_tokens == len(context) and out.question_tokens == len(question)


def test_questions_never_see_each_other(llama):
    """Asking one question leaves the compressed context exactly as it was for the next."""
    ctx = compress_context(llama, TOKENIZER, [], build("dapq", budget=16), context_ids=[CONTEXT])
    before = [(layer.keys.clone(), layer.values.clone()) for layer in ctx.state.cache.layers]
    q1, q2 = random_prompt(5, seed=40), random_prompt(8, seed=41)
    first = ask(llama, TOKENIZER, ctx, [], question_ids=[q1], max_new_tokens=6)[0]
    ask(llama, TOKENIZER, ctx, [], question_ids=[q2], max_new_tokens=6)
    again = ask(llama, TOKENIZER, ctx, [], question_ids=[q1], max_new_tokens=6)[0]
    assert again.token_ids == first.token_ids
    for layer, (keys, values) in zip(ctx.state.cache.layers, before, strict=True):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
    # Several questions of one context in one batch: each as if asked alone.
    both = ask(llama, TOKENIZER, ctx, [], question_ids=[q1, q2], max_new_tokens=6)
    assert both[0].token_ids == first.token_ids


def test_answer_refuses_a_question_count_that_does_not_match(llama):
    ctx = compress_context(llama, TOKENIZER, [], "full", context_ids=[CONTEXT, CONTEXT[:30]])
    with pytest.raises(Exception, match="3 questions for 2 contexts"):
        ask(llama, TOKENIZER, ctx, [], question_ids=[QUESTION] * 3)
    with pytest.raises(Exception, match="a question has no tokens"):  # else answered from a padding slot
        ask(llama, TOKENIZER, ctx, [], question_ids=[QUESTION, []])
    state = PrefillResult(ctx.state.cache.select([0, 1]), None, ctx.state.batch.select([0, 1]))
    with pytest.raises(Exception, match="1 questions for 2 context rows"):
        answer(llama, TOKENIZER, state, [QUESTION], SamplingConfig(max_new_tokens=2))
    by_row = ask(llama, TOKENIZER, ctx, [], question_ids=[QUESTION, QUESTION], rows=[1, 1], max_new_tokens=4)
    alone = ask(llama, TOKENIZER, compress_context(llama, TOKENIZER, [], "full", context_ids=[CONTEXT[:30]]), [],
                question_ids=[QUESTION], max_new_tokens=4)[0]
    assert by_row[0].token_ids == by_row[1].token_ids == alone.token_ids


def test_chat_split_puts_the_user_turn_back_together(tokenizer):
    split = ChatSplit.of(tokenizer)
    content = "The grass is green. What is green?"
    full = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=False)
    assert split.opening + content + split.closing == full
    context_ids = encode_context(tokenizer, "The grass is green.", chat=True)
    question_ids = encode_question(tokenizer, " What is green?", chat=True, answer_prefix=" It is")
    text = tokenizer.decode(context_ids + question_ids)
    assert text == split.opening + "The grass is green. What is green?" + split.closing + " It is"


def test_shared_prefill_in_context_mode_equals_ask(llama):
    """generate_many(question_ids=...): one FullKV prefill of the context for every method."""
    methods = [build("full")] + [build(n, budget=12) for n in EVICTING]
    shared = generate_many(llama, TOKENIZER, CONTEXT, methods, max_new_tokens=6, question_ids=QUESTION)
    for method, result in zip(methods, shared, strict=True):
        ctx = compress_context(llama, TOKENIZER, [], method, context_ids=[CONTEXT])
        alone = ask(llama, TOKENIZER, ctx, [], question_ids=[QUESTION], max_new_tokens=6)[0]
        assert result.token_ids == alone.token_ids, method.name
        assert result.question_tokens == len(QUESTION) and result.prompt_tokens == len(CONTEXT)
