"""Ground-truth decode queries, the oracle, and the identities the analyses rely on."""

from __future__ import annotations

import torch

from dapq.analysis import capture_pseudo_queries, cosine, keep_recall, trace_decode
from dapq.compress import make_batch, prefill
from dapq.methods import build

from conftest import random_prompt, tiny_model


def _model(kind="llama"):
    m = tiny_model(kind)
    m.generation_config.eos_token_id = None
    return m


def test_self_similarity_is_one():
    q = torch.randn(3, 4, 16)
    torch.testing.assert_close(cosine(q, q), torch.ones(3, 4))


def test_pseudo_queries_equal_real_decode_queries_when_content_is_the_real_continuation():
    """DapQ with content = the generated tokens at offset 0 reproduces the decode queries exactly."""
    for kind in ("llama", "qwen3"):
        model = _model(kind)
        prompt = random_prompt(40, seed=1)
        trace = trace_decode(model, prompt, 6)
        method = build("dapq", budget=8, n_pseudo=6, content="tokens", token_ids=tuple(trace.tokens))
        pre, post = capture_pseudo_queries(model, prompt, method)
        torch.testing.assert_close(pre[0], trace.queries_pre[0], atol=1e-5, rtol=1e-5)  # layer 0
        torch.testing.assert_close(post, trace.queries_post, atol=1e-4, rtol=1e-4)  # and every layer
        # Same content at other positions: pre-RoPE equal at layer 0, post-RoPE not.
        moved = build("dapq", budget=8, n_pseudo=6, content="tokens", token_ids=tuple(trace.tokens), position_offset=9)
        pre_m, post_m = capture_pseudo_queries(model, prompt, moved)
        torch.testing.assert_close(pre_m[0], trace.queries_pre[0], atol=1e-5, rtol=1e-5)
        assert cosine(post_m[0], trace.queries_post[0]).mean() < 0.99


def test_oracle_keeps_top_k_of_summed_real_attention():
    model = _model()
    prompt, budget, steps = random_prompt(60, seed=2), 12, 5
    trace = trace_decode(model, prompt, steps)
    oracle = build("oracle", budget=budget, steps=steps)
    state = prefill(model, oracle, make_batch(model, oracle, [prompt], pad_id=0))
    n_kv = model.config.num_key_value_heads
    for layer, layout in enumerate(state.cache.layers):
        summed = trace.attention[layer].sum(dim=1)  # (Hq, Lp): summed over the T decode steps
        per_kv = summed.view(n_kv, -1, len(prompt)).mean(dim=1)  # GQA group mean
        expected = per_kv.sort(dim=-1, descending=True, stable=True).indices[:, :budget].sort(-1).values
        assert torch.equal(layout.kept_indices[0], expected), f"layer {layer}"
        assert torch.all(keep_recall(layout.kept_indices[0], expected) == 1.0)  # recall vs itself


def test_keep_recall():
    kept = torch.tensor([[1, 2, 3, 4]])
    assert keep_recall(kept, torch.tensor([[2, 4, 9, 11]])).tolist() == [0.5]
