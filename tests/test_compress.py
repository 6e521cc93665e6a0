"""The engine: exactness, equivalence to masked references, batching, cache sizes, post-hoc use."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import dapq
from dapq import compat
from dapq.compress import compress, make_batch, prefill
from dapq.decoding import DecodeStepper
from dapq.errors import ConfigError
from dapq.generation import SamplingConfig, decode
from dapq.methods import available, build

from conftest import TOKENIZER, random_prompt, tiny_model
from helpers import compressed_logits, hf_greedy, masked_reference_logits

NEW = 8


class _NoEosTokenizer:
    """Minimal tokenizer stand-in for id-level tests: no EOS, so every run decodes NEW tokens."""

    pad_token_id = 0
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


TOK = _NoEosTokenizer()


def _method(name: str, budget: int | None, **kw):
    if name == "full":
        return build("full")
    return build(name, budget=budget, **kw)


def _run(model, prompts, method, n=NEW, tokenizer=TOK):
    model.generation_config.eos_token_id = None
    batch = make_batch(model, method, prompts, pad_id=0, tokenizer=TOKENIZER)
    state = prefill(model, method, batch)
    ids, _, _ = decode(model, tokenizer, state, SamplingConfig(max_new_tokens=n))
    return ids, state


@pytest.mark.parametrize("name", available())
def test_budget_at_least_prompt_is_exactly_fullkv(any_model, name):
    """Every method with a budget >= Lp must reproduce plain transformers greedy decoding."""
    prompt = random_prompt(40, seed=1)
    expected = hf_greedy(any_model, prompt, NEW)
    ids, state = _run(any_model, [prompt], _method(name, 40))
    assert ids[0] == expected
    assert state.cache.kept_per_layer() == [40] * any_model.config.num_hidden_layers


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("name,kw", [
    ("dapq", {}),
    ("dapq", {"content": "random_vocab", "keep_recent": 4, "normalize": "all"}),
    ("dapq", {"layer_budget": "pyramid", "keep_recent": 4, "group_reduce": "max", "query_reduce": "max"}),
    ("dapq_hybrid", {"keep_recent": 4}),
    ("deferkv", {}),
    ("deferkv", {"steps": 3, "window": 0, "keep_recent": 0}),
    ("snapkv", {}),
    ("pyramidkv", {}),
    ("h2o", {}),
    ("streamingllm", {}),
    ("lacache", {}),
    ("random", {}),
    ("dapq", {"head_budget": "adaptive"}),
    ("dapq", {"head_budget": "adaptive", "keep_recent": 4, "layer_budget": "pyramid"}),
    ("snapkv", {"head_budget": "adaptive", "head_floor": 0.5}),
])
def test_pruned_cache_equals_masked_full_cache(kind, name, kw):
    """Physically pruned cache == full cache with the evicted keys masked out, to fp32 tolerance."""
    model = tiny_model(kind, attn="eager")
    model.generation_config.eos_token_id = None
    prompt = random_prompt(60, seed=2)
    method = build(name, budget=20, **kw)
    batch = make_batch(model, method, [prompt], pad_id=0, tokenizer=TOKENIZER)
    state = prefill(model, method, batch)
    assert max(state.cache.kept_per_layer()) < 60  # something was evicted
    first = int(state.logits[0].argmax())
    tokens = [first] + random_prompt(5, seed=3)
    ours = compressed_logits(model, state, tokens)
    ref = masked_reference_logits(model, prompt, state.cache, tokens)
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)
    # And the masked reference is not trivially the full cache: eviction changed the logits.
    full = masked_reference_logits(model, prompt, _FullLayout(model, 60), tokens)
    assert (ref - full).abs().max() > 1e-4


class _FullLayout:
    """A stand-in cache whose layers keep everything (for the 'eviction mattered' check)."""

    def __init__(self, model, lp):
        from types import SimpleNamespace

        self.layers = [SimpleNamespace(kept_indices=None)] * model.config.num_hidden_layers


def test_first_token_logits_equal_plain_prefill(llama):
    """DapQ's extended prefill gives the same logits at Lp-1 as a plain prefill (causality)."""
    prompt = random_prompt(50, seed=4)
    state = prefill(llama, build("dapq", budget=16), make_batch(llama, build("dapq", budget=16), [prompt], pad_id=0, tokenizer=TOKENIZER))
    plain = llama(input_ids=torch.tensor([prompt])).logits[0, -1]
    torch.testing.assert_close(state.logits[0], plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", available())
def test_batch_equals_each_prompt_alone(any_model, name):
    """A padded batch of different lengths decodes each prompt exactly as it decodes alone."""
    prompts = [random_prompt(n, seed=10 + n) for n in (45, 30, 60)]
    method = _method(name, 24)
    batched, state = _run(any_model, prompts, method)
    for prompt, out in zip(prompts, batched, strict=True):
        alone, _ = _run(any_model, [prompt], method)
        assert out == alone[0]
    # Padding is never kept: every row attends exactly min(budget, Lp) real tokens per layer.
    for row, lp in enumerate((45, 30, 60)):
        expected_kept = min(method.layer_budgets(lp, any_model.config.num_hidden_layers)[0], lp)
        assert state.cache.layers[0].kept_tokens(row) == expected_kept


@pytest.mark.parametrize("name,kw", [("pyramidkv", {"budget": 24}), ("snapkv", {"keep_fraction": 0.4})])
def test_non_canonical_batches_equal_alone(llama, name, kw):
    """Per-layer budgets and ratio budgets in a padded batch need per-layer masks; still exact."""
    prompts = [random_prompt(n, seed=20 + n) for n in (70, 33, 50)]
    method = build(name, **kw)
    batched, state = _run(llama, prompts, method)
    assert not state.cache.canonical
    for prompt, out in zip(prompts, batched, strict=True):
        alone, _ = _run(llama, [prompt], method)
        assert out == alone[0]


@pytest.mark.parametrize("name", ["dapq", "snapkv", "h2o", "deferkv"])
def test_head_budgets_split_each_layers_total_and_batch_like_alone(llama, name):
    """Ada-KV's split: heads keep different counts, the layer's total stays Hkv * K, each head keeps
    the safeguard's share, and a padded batch (per-head masks) decodes each prompt as alone."""
    prompts = [random_prompt(n, seed=70 + n) for n in (60, 37, 52)]
    method = build(name, budget=16, head_budget="adaptive")
    batched, state = _run(llama, prompts, method)
    assert not state.cache.canonical
    uneven = False
    for layer in state.cache.layers:
        counts = layer.prompt_slots - layer.pad_slots  # (B, Hkv) real tokens each head keeps
        assert counts.sum(dim=1).tolist() == [16 * counts.shape[1]] * len(prompts)
        assert bool((counts >= 3).all())  # floor(0.2 * 16)
        assert [layer.kept_tokens(row) for row in range(len(prompts))] == [16] * len(prompts)
        for row in range(len(prompts)):
            columns = layer.kept_columns(row)
            assert (columns >= 0).sum(dim=-1).tolist() == counts[row].tolist()
        uneven |= bool((counts != 16).any())
    assert uneven  # the split is not the flat one, so the checks above are not trivial
    for prompt, out in zip(prompts, batched, strict=True):
        alone, _ = _run(llama, [prompt], method)
        assert out == alone[0]


def test_head_budgets_refuse_position_only_methods_and_flash_attention(llama):
    with pytest.raises(ConfigError, match="ranks every head alike"):
        build("streamingllm", budget=16, head_budget="adaptive")
    prompt = random_prompt(40, seed=6)
    method = build("dapq", budget=12, head_budget="adaptive")
    state = prefill(llama, method, make_batch(llama, method, [prompt], pad_id=0, tokenizer=TOKENIZER))
    llama.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(ConfigError, match="per-head mask"), DecodeStepper(llama, state, 2):
            pass
    finally:
        llama.config._attn_implementation = "sdpa"


@pytest.mark.parametrize("name", ["dapq", "snapkv", "h2o", "streamingllm", "lacache"])
def test_hf_generate_continues_with_original_positions(llama, name):
    """Plain model.generate() on the compressed cache gives the same tokens as dapq's loop."""
    prompts = [random_prompt(n, seed=30 + n) for n in (40, 55)]
    method = build(name, budget=16)
    ours, _ = _run(llama, prompts, method)
    batch = make_batch(llama, method, prompts, pad_id=0, tokenizer=TOKENIZER)
    state = prefill(llama, method, batch)
    assert state.cache.canonical
    first = state.logits.argmax(-1, keepdim=True)
    width = batch.width
    ids = torch.cat([batch.input_ids[:, :width], first], dim=1)
    mask = torch.cat([batch.attention_mask[:, :width], torch.ones_like(first)], dim=1)
    out = llama.generate(ids, attention_mask=mask, **compat.cache_kwargs(llama, state.cache), max_new_tokens=NEW - 1,
                         min_new_tokens=NEW - 1, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert out[:, width:].tolist() == ours


def test_hf_generate_single_prompt_pyramid(llama):
    """Without padding, per-layer widths also work under plain generate() with sdpa."""
    prompt = random_prompt(80, seed=5)
    method = build("pyramidkv", budget=16)
    ours, _ = _run(llama, [prompt], method)
    state = prefill(llama, method, make_batch(llama, method, [prompt], pad_id=0, tokenizer=TOKENIZER))
    first = state.logits.argmax(-1, keepdim=True)
    ids = torch.cat([torch.tensor([prompt]), first], dim=1)
    out = llama.generate(ids, attention_mask=torch.ones_like(ids), **compat.cache_kwargs(llama, state.cache),
                         max_new_tokens=NEW - 1, min_new_tokens=NEW - 1, do_sample=False, eos_token_id=None,
                         pad_token_id=0)
    assert out[0, 80:].tolist() == ours[0]


@pytest.mark.parametrize("name", [n for n in available() if n != "full"])
def test_cache_bytes_match_budget_formula(llama, name):
    """Physical cache bytes == 2 * sum_l(C_l) * Hkv * d * 4 bytes, with C_l from the budgets."""
    lp, budget = 100, 24
    method = build(name, budget=budget)
    _, state = _run(llama, [random_prompt(lp, seed=6)], method, n=1)
    cfg = llama.config
    per_token = 2 * cfg.num_key_value_heads * cfg.head_dim * 4
    expected_layers = method.layer_budgets(lp, cfg.num_hidden_layers)
    if name == "pyramidkv":
        assert len(set(expected_layers)) > 1 and sum(expected_layers) == budget * cfg.num_hidden_layers
    else:
        assert expected_layers == [budget] * cfg.num_hidden_layers
    assert state.cache.kept_per_layer() == expected_layers
    # n=1 decodes no extra token, so the cache holds prompt slots only.
    assert state.stats.kv_bytes_kept == per_token * sum(expected_layers)
    assert state.stats.kv_bytes_full == per_token * lp * cfg.num_hidden_layers
    assert state.cache.get_seq_length() == lp  # logical length: positions continue at Lp


@pytest.mark.parametrize("name", ["dapq", "dapq_hybrid", "deferkv", "snapkv", "h2o", "streamingllm", "lacache"])
def test_posthoc_compress_matches_prefill(llama, name):
    """compress() on someone else's prefilled DynamicCache keeps the same tokens as prefill()."""
    prompts = [random_prompt(n, seed=40 + n) for n in (50, 36)]
    method = build(name, budget=12)
    batch = make_batch(llama, method, prompts, pad_id=0, tokenizer=TOKENIZER)
    state = prefill(llama, method, batch)
    width = batch.width
    ids, mask = batch.input_ids[:, :width], batch.attention_mask[:, :width]
    cache = DynamicCache()
    with torch.no_grad():
        compat.forward(llama, ids, attention_mask=mask, position_ids=batch.position_ids[:, :width], cache=cache,
                       first_column=0)
    post = compress(llama, cache, method, ids, mask, tokenizer=TOKENIZER)
    for a, b in zip(state.cache.layers, post.cache.layers, strict=True):
        assert torch.equal(a.kept_indices.sort(-1).values, b.kept_indices.sort(-1).values)
        torch.testing.assert_close(
            state.cache.layers[0].keys, post.cache.layers[0].keys, atol=1e-5, rtol=1e-5
        )
    if name in ("snapkv", "h2o"):
        torch.testing.assert_close(post.logits, state.logits, atol=1e-4, rtol=1e-4)


def test_deferkv_with_decoding_queries_only_is_the_oracle(llama):
    """DeferKV scoring with T real decoding queries alone keeps exactly the oracle's top-K.

    The oracle gets its T tokens from transformers' own generate() and scores them in a second
    prefill; DeferKV decodes them over its own prefill cache. Same queries, same keep set.
    """
    llama.generation_config.eos_token_id = None
    prompt = random_prompt(80, seed=14)
    defer = build("deferkv", budget=12, steps=4, window=0, keep_recent=0, kernel=1)
    oracle = build("oracle", budget=12, steps=4)
    kept = [prefill(llama, m, make_batch(llama, m, [prompt], pad_id=0, tokenizer=TOKENIZER)).cache.layers for m in (defer, oracle)]
    for a, b in zip(*kept, strict=True):
        assert torch.equal(a.kept_indices, b.kept_indices)
    # The prompt window changes the choice, so the equality above is not vacuous.
    mixed = prefill(llama, build("deferkv", budget=12, steps=4, kernel=1),
                    make_batch(llama, defer, [prompt], pad_id=0, tokenizer=TOKENIZER)).cache.layers
    assert any(not torch.equal(a.kept_indices, b.kept_indices) for a, b in zip(mixed, kept[1], strict=True))


def test_small_budget_keeps_newest_part_of_window(llama):
    """A budget below SnapKV's window keeps the newest budget tokens of the window."""
    method = build("snapkv", budget=3, window=8)
    _, state = _run(llama, [random_prompt(30, seed=7)], method, n=1)
    for layer in state.cache.layers:
        assert layer.kept_indices[0].tolist() == [[27, 28, 29]] * 2


def test_streamingllm_keeps_sinks_and_recent(llama):
    _, state = _run(llama, [random_prompt(50, seed=8)], build("streamingllm", budget=10, sinks=4), n=1)
    for layer in state.cache.layers:
        assert layer.kept_indices[0, 0].tolist() == [0, 1, 2, 3, 44, 45, 46, 47, 48, 49]


def test_a_layer_invariant_selection_equals_selecting_at_every_layer(llama):
    """StreamingLLM selects once per forward and budget; a per-layer selection picks the same columns."""
    from dapq.methods.streamingllm import StreamingLLM

    class EveryLayer(StreamingLLM):
        layer_invariant = False

    prompts = [random_prompt(50, seed=9), random_prompt(31, seed=10)]  # left padding: mixed lengths
    for kw in ({"budget": 10}, {"budget": 12, "layer_budget": "pyramid"}):
        once = _run(llama, prompts, StreamingLLM(**kw), n=3)
        each = _run(llama, prompts, EveryLayer(**kw), n=3)
        assert once[0] == each[0]  # the same greedy tokens
        for a, b in zip(once[1].cache.layers, each[1].cache.layers, strict=True):
            assert torch.equal(a.kept_indices, b.kept_indices) and torch.equal(a.pad_slots, b.pad_slots)
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    budgets = {tuple(layer.kept_indices.shape) for layer in once[1].cache.layers}
    assert len(budgets) > 1  # the pyramid gave layers different budgets: one selection each


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_with_fp32_scores(dtype):
    model = tiny_model("llama").to(dtype)
    model.generation_config.eos_token_id = None
    ids, state = _run(model, [random_prompt(40, seed=9)], build("dapq", budget=8), n=4)
    assert len(ids[0]) == 4
    assert state.cache.layers[0].keys.dtype == dtype and state.logits.dtype == torch.float32
    assert state.stats.kv_bytes_kept == 2 * 8 * 2 * 16 * 2 * model.config.num_hidden_layers


@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
def test_mistral_and_qwen2(kind):
    """The other two supported families: exact no-op and masked-reference equivalence."""
    model = tiny_model(kind, attn="eager")
    model.generation_config.eos_token_id = None
    prompt = random_prompt(50, seed=11)
    assert _run(model, [prompt], build("dapq", budget=50))[0][0] == hf_greedy(model, prompt, NEW)
    state = prefill(model, build("snapkv", budget=12), make_batch(model, build("snapkv", budget=12), [prompt], pad_id=0, tokenizer=TOKENIZER))
    tokens = [int(state.logits[0].argmax())] + random_prompt(3, seed=12)
    torch.testing.assert_close(compressed_logits(model, state, tokens),
                               masked_reference_logits(model, prompt, state.cache, tokens), atol=2e-5, rtol=1e-4)


def test_public_generate_api(llama, tokenizer):
    """The five-line API from the README runs on text prompts."""
    method = dapq.build("dapq", budget=8)
    out = dapq.generate(llama, tokenizer, ["The grass is green. The sky is blue.", "Paris"], method,
                        max_new_tokens=3, chat=True)
    assert len(out) == 2 and all(r.prompt_tokens > 0 for r in out)
    assert out[0].kv_bytes_kept < out[0].kv_bytes_full
