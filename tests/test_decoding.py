"""The decode modes: buffers written in place give the tokens of the growing cache, for every layout."""

from __future__ import annotations

import pytest
import torch

from dapq import compat
from dapq.cache import PreallocatedLayer
from dapq.compress import make_batch, prefill
from dapq.context import ask, compress_context
from dapq.errors import ConfigError
from dapq.generation import SamplingConfig, generate, generate_many
from dapq.methods import available, build

from conftest import TOKENIZER, random_prompt

NEW = 12
#: On the CPU ``graph`` runs its fixed-shape step uncaptured: the shapes, masks and in-place
#: writes a CUDA graph would replay, checked against the other modes.
MODES = ("eager", "static", "graph")


def _method(name: str, budget: int = 20):
    return build(name) if name == "full" else build(name, budget=budget)


@pytest.mark.parametrize("name", available())
def test_static_decode_gives_the_eager_tokens_on_a_mixed_batch(llama, name):
    """Every method's layout, a left-padded batch of three lengths, greedy, fp32."""
    llama.generation_config.eos_token_id = None
    prompts = [random_prompt(n, seed=30 + n) for n in (45, 28, 61)]
    runs = {mode: generate(llama, TOKENIZER, None, _method(name), prompt_ids=prompts, max_new_tokens=NEW,
                           decode=mode) for mode in MODES}
    for mode in ("static", "graph"):
        assert [r.token_ids for r in runs[mode]] == [r.token_ids for r in runs["eager"]], mode
    assert all(len(r.token_ids) == NEW for r in runs["static"])


@pytest.mark.parametrize("kw", [dict(budget=24), dict(keep_fraction=0.4), dict(budget=16, head_budget="adaptive")])
def test_static_decode_on_per_layer_and_ratio_layouts(llama, kw):
    """PyramidKV with padding, kept fractions in a batch and head-wise budgets need per-layer (or
    per-head) masks: same tokens."""
    llama.generation_config.eos_token_id = None
    prompts = [random_prompt(n, seed=50 + n) for n in (60, 33)]
    method = build("pyramidkv", **kw)
    eager, static, graph = (generate(llama, TOKENIZER, None, method, prompt_ids=prompts, max_new_tokens=NEW,
                                     decode=mode) for mode in MODES)
    assert [r.token_ids for r in static] == [r.token_ids for r in eager] == [r.token_ids for r in graph]


def test_static_decode_in_context_mode_with_several_questions(llama):
    llama.generation_config.eos_token_id = None
    context = random_prompt(70, seed=5)
    questions = [random_prompt(n, seed=60 + n) for n in (3, 7, 5)]
    for name in ("dapq", "deferkv", "pyramidkv"):
        ctx = compress_context(llama, TOKENIZER, [], build(name, budget=16), context_ids=[context])
        answers = {mode: ask(llama, TOKENIZER, ctx, [], question_ids=questions, max_new_tokens=NEW, decode=mode)
                   for mode in MODES}
        for mode in ("static", "graph"):
            assert [a.token_ids for a in answers[mode]] == [a.token_ids for a in answers["eager"]], (name, mode)


def test_static_decode_in_shared_prefill_sweeps(llama):
    llama.generation_config.eos_token_id = None
    prompt = random_prompt(64, seed=8)
    methods = [_method(n, 16) for n in ("full", "dapq", "snapkv", "deferkv", "streamingllm")]
    eager, static, graph = (generate_many(llama, TOKENIZER, prompt, methods, max_new_tokens=NEW, decode=mode,
                                          max_batch=2) for mode in MODES)
    assert [r.token_ids for r in static] == [r.token_ids for r in eager] == [r.token_ids for r in graph]


def test_hf_generate_continues_a_preallocated_cache(llama):
    """model.generate() on a cache whose layers are preallocated: the tokens of the growing one."""
    llama.generation_config.eos_token_id = None
    prompt = random_prompt(50, seed=9)
    outs = []
    for reserve in (False, True):
        method = build("snapkv", budget=16)
        state = prefill(llama, method, make_batch(llama, method, [prompt], pad_id=0))
        if reserve:
            state.cache.reserve(NEW)
            assert all(isinstance(layer, PreallocatedLayer) for layer in state.cache.layers)
        first = state.logits.argmax(-1, keepdim=True)
        ids = torch.cat([torch.tensor([prompt]), first], 1)
        out = llama.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                             pad_token_id=0, **compat.cache_kwargs(llama, state.cache))
        outs.append(out[0, len(prompt):].tolist())
    assert outs[0] == outs[1] and len(outs[0]) == NEW + 1


def test_preallocated_layer_writes_in_place_and_grows_past_its_capacity(llama):
    method = build("snapkv", budget=8)
    state = prefill(llama, method, make_batch(llama, method, [random_prompt(30, seed=2)], pad_id=0))
    state.cache.reserve(2)
    layer = state.cache.layers[0]
    buffer = layer._k
    new = torch.randn(1, layer.keys.shape[1], 1, layer.keys.shape[3])
    keys, _ = layer.update(new, new)
    assert layer._k is buffer and keys.data_ptr() == buffer.data_ptr()  # no copy of the cache
    assert torch.equal(keys[:, :, -1:], new) and keys.shape[2] == 9 and layer.get_seq_length() == 31
    for _ in range(3):  # past the 2 reserved columns: it grows, and keeps what it had
        keys, _ = layer.update(new, new)
    assert keys.shape[2] == 12 and layer.capacity >= 12 and torch.equal(keys[:, :, 8:], new.expand(-1, -1, 4, -1))


def test_unknown_decode_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="decode must be one of auto, static, graph, eager"):
        SamplingConfig(decode="graphs")


def test_graph_mode_refuses_flash_attention_and_overfeeding(llama):
    method = build("snapkv", budget=8)
    state = prefill(llama, method, make_batch(llama, method, [random_prompt(30, seed=2)], pad_id=0))
    from dapq.decoding import DecodeStepper

    with DecodeStepper(llama, state, 2, decode="graph") as step:
        token = state.logits.argmax(-1)
        step(token)
        step(token)
        with pytest.raises(ValueError, match="reserved 2 columns"):
            step(token)
