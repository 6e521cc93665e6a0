"""The method contract: one file and one registry line make a new method, checked in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from dapq.compress import compress, make_batch, prefill
from dapq.errors import ConfigError
from dapq.generation import generate_many
from dapq.methods import Method, Observation, available, build, param, register
from dapq.methods import registry as registry_module

from conftest import TOKENIZER, random_prompt


@dataclass
class KeyNorm(Method):
    """Keep the keys of smallest L2 norm (the KNorm heuristic): a whole method in a dozen lines."""

    name: ClassVar[str] = "test_knorm"
    paper: ClassVar[str] = "test only"

    sign: int = param(-1, choices=(-1, 1))

    def score(self, ctx):
        return self.sign * ctx.keys[:, :, : ctx.width].float().norm(dim=-1)


@pytest.fixture
def knorm():
    register(KeyNorm)
    yield KeyNorm
    registry_module._REGISTRY.pop(KeyNorm.name)


def test_a_new_method_is_one_class_and_one_register_line(llama, knorm):
    """No engine change: prefill, post-hoc compress() and shared-prefill sweeps all run it."""
    assert "test_knorm" in available()
    method = build("test_knorm", budget=6)
    prompt = random_prompt(40, seed=3)
    state = prefill(llama, method, make_batch(llama, method, [prompt], pad_id=0))
    # An independent reference: the six smallest key norms of a plain prefill, per layer and head.
    out = llama(input_ids=torch.tensor([prompt]), use_cache=True)
    for layer, cached in zip(out.past_key_values.layers, state.cache.layers, strict=True):
        expected = layer.keys[0].norm(dim=-1).argsort(dim=-1, stable=True)[:, :6].sort(dim=-1).values
        assert torch.equal(cached.kept_indices[0], expected)
    again = compress(llama, llama(input_ids=torch.tensor([prompt]), use_cache=True).past_key_values, method,
                     torch.tensor([prompt]))
    assert all(torch.equal(a.kept_indices, b.kept_indices) for a, b in zip(state.cache.layers, again.cache.layers,
                                                                          strict=True))
    results = generate_many(llama, TOKENIZER, prompt, [method, build("test_knorm", budget=6, sign=1)],
                            max_new_tokens=3)
    assert [r.config["method"] for r in results] == ["test_knorm"] * 2


@pytest.mark.parametrize(("params", "message"), [
    (dict(window=2.5), "window must be an integer, got 2.5"),
    (dict(window=1e400), "window must be an integer"),
    (dict(window="x"), "window must be an integer, got 'x'"),
    (dict(window=True), "window must be an integer, got True"),
    (dict(window=0), "window must be >= 1, got 0"),
    (dict(kernel=0), "kernel must be >= 1, got 0"),
    (dict(pooling="min"), "pooling must be one of max, avg, got 'min'"),
    (dict(layer_budget="steep"), "layer_budget must be one of flat, pyramid"),
])
def test_parameters_are_checked_by_their_declarations(params, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        build("snapkv", budget=8, **params)


def test_declared_types_and_ranges_of_every_kind():
    with pytest.raises(ConfigError, match="seed must be an integer, got 'x'"):
        build("dapq", budget=8, seed="x")
    with pytest.raises(ConfigError, match="keep_fraction must be < 1"):
        build("dapq", keep_fraction=1)
    with pytest.raises(ConfigError, match="prompt_weight must be <= 1"):
        build("deferkv", budget=8, prompt_weight=1.5)
    with pytest.raises(ConfigError, match="token_ids must be a list of integers"):
        build("dapq", budget=8, content="tokens", token_ids=[1, "a"])
    with pytest.raises(ConfigError, match="budget must be an integer, got 8.0"):
        build("snapkv", budget=8.0)
    assert build("dapq", budget=8, content="tokens", token_ids=[1, 2, 3]).token_ids == (1, 2, 3)
    assert build("deferkv", budget=8, prompt_weight=1).prompt_weight == 1.0  # ints are numbers
    assert isinstance(build("deferkv", budget=8, prompt_weight=1).prompt_weight, float)


def test_observations_say_what_each_method_observes():
    assert build("snapkv", budget=8).observation() == Observation(prompt_tail=8, keep_recent=8)
    assert build("dapq", budget=8).observation() == Observation(pseudo_tokens=32)
    assert build("dapq_hybrid", budget=8, window=4).observation() == Observation(prompt_tail=4, pseudo_tokens=32)
    assert build("deferkv", budget=8).observation() == Observation(prompt_tail=8, lookahead_steps=4, keep_recent=8)
    assert build("h2o", budget=8).observation().queries(100) == 100
    assert build("streamingllm", budget=8).observation() == Observation()
    assert not build("full").evicts and build("snapkv", budget=8).evicts
    with pytest.raises(ValueError):
        Observation(pseudo_tokens=2, lookahead_steps=2)


def test_the_pyramid_is_one_option_of_every_method():
    """PyramidKV is SnapKV with the schedule on; any method takes the same schedule."""
    pyramid = build("pyramidkv", budget=64)
    assert pyramid.layer_budgets(1000, 30) == build("snapkv", budget=64, layer_budget="pyramid").layer_budgets(1000, 30)
    assert pyramid.layer_budgets(1000, 30) != [64] * 30
    assert sum(build("streamingllm", budget=64, layer_budget="pyramid").layer_budgets(1000, 30)) == 64 * 30


@pytest.mark.parametrize("name", [n for n in available() if n not in ("full", "streamingllm", "random")])
def test_head_budgets_are_recorded_only_when_set(name):
    """The cell key hashes the configuration: a parameter added later must not change the keys of
    the configurations every store already holds, so it is recorded only away from its default."""
    flat = build(name, budget=8)
    assert "head_budget" not in flat.config() and "head_floor" not in flat.config()
    assert set(flat.config()) == {"method"} | flat.field_names() - {"head_budget", "head_floor"}
    split = build(name, budget=8, head_budget="adaptive", head_floor=0.5)
    assert split.config()["head_budget"] == "adaptive" and split.config()["head_floor"] == 0.5
    for method in (flat, split):
        params = {k: v for k, v in method.config().items() if k != "method"}
        assert build(name, **params) == method  # the record rebuilds the method
