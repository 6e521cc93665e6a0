"""Per-method rules: configuration checks, budgets, layouts and the DapQ pseudo context."""

from __future__ import annotations

import pickle

import pytest

from dapq.errors import ConfigError
from dapq.methods import available, build
from dapq.methods.budgets import pyramid_budgets
from dapq.methods.lacache import ladder_shape

from conftest import TOKENIZER
from helpers import kept_indices


@pytest.mark.parametrize("name", available())
def test_methods_are_small_picklable_dataclasses(name):
    method = build(name) if name == "full" else build(name, budget=64)
    clone = pickle.loads(pickle.dumps(method))
    assert clone == method
    assert clone.config()["method"] == name


@pytest.mark.parametrize("bad", [dict(budget=0), dict(budget=-3), dict(keep_fraction=0.0),
                                 dict(keep_fraction=1.0), dict(budget=4, keep_fraction=0.5), dict()])
def test_bad_budgets_are_rejected(bad):
    with pytest.raises(ConfigError):
        build("snapkv", **bad)


def test_unknown_names_and_parameters():
    with pytest.raises(ConfigError, match="unknown method"):
        build("nope", budget=3)
    with pytest.raises(ConfigError, match="no parameter"):
        build("snapkv", budget=3, windw=4)
    for name, kw in [("dapq", dict(n_pseudo=0)), ("snapkv", dict(window=0)), ("dapq", dict(content="bogus")),
                     ("dapq", dict(prefix=3, suffix=3)), ("dapq", dict(inside_part=4)), ("dapq", dict(kernel=0))]:
        with pytest.raises(ConfigError):
            build(name, budget=8, **kw)


def test_pyramid_schedule():
    budgets = pyramid_budgets(128, 8, 4000, 30)
    assert sum(budgets) == 128 * 30  # same mean as the flat budget
    assert budgets == sorted(budgets, reverse=True) and budgets[0] > 200 and budgets[-1] < 32
    assert pyramid_budgets(128, 8, 200, 30) == [128] * 30  # Lp < 2(M - W): flat
    clipped = pyramid_budgets(128, 8, 230, 30)
    assert max(clipped) <= 230 and sum(clipped) == 128 * 30


def test_ladder_shape():
    assert ladder_shape(30, 30, 0) == (1, 1)  # the span covers every layer: no ladder
    assert ladder_shape(30, 15, 5) == (3, 2)  # keep 2 of every 3, shifting per layer


def test_dapq_pseudo_content(tokenizer):
    prompt = list(range(100, 160))
    m = build("dapq", budget=8, preset="paper")
    assert m.pseudo_tokens(prompt, vocab_size=320, model_type="llama") == prompt[:8] + prompt[-24:]
    assert m.pseudo_tokens(prompt, vocab_size=320, model_type="qwen2") == prompt[:2] + prompt[-30:]
    assert build("dapq", budget=8, n_pseudo=8).split("llama") == (2, 6)
    # The default content is the fixed text; it needs the tokenizer, and says so.
    default = build("dapq", budget=8)
    assert default.pseudo_tokens(prompt, vocab_size=320, model_type="llama", tokenizer=tokenizer) == \
        build("dapq", budget=8, content="fixed").pseudo_tokens(prompt, vocab_size=320, model_type="llama",
                                                             tokenizer=tokenizer)
    with pytest.raises(ConfigError, match="needs a tokenizer"):
        default.pseudo_tokens(prompt, vocab_size=320, model_type="llama")
    sample = build("dapq", budget=8, content="random_sample").pseudo_tokens(prompt, vocab_size=320, model_type="llama")
    assert len(sample) == 32 and sample == sorted(sample) and len(set(sample)) == 32 and set(sample) <= set(prompt)
    span = build("dapq", budget=8, content="random_span", seed=3).pseudo_tokens(prompt, vocab_size=320,
                                                                                model_type="llama")
    assert span == list(range(span[0], span[0] + 32))
    vocab = build("dapq", budget=8, content="random_vocab").pseudo_tokens(prompt, vocab_size=320, model_type="llama")
    assert len(vocab) == 32 and max(vocab) < 320
    fixed = build("dapq", budget=8, content="fixed").pseudo_tokens(prompt, vocab_size=320, model_type="llama",
                                                                   tokenizer=tokenizer)
    once = tokenizer("Sorry, I don't know. ", add_special_tokens=False)["input_ids"]
    assert len(fixed) == 32 and fixed[: len(once)] == once
    text = build("dapq", budget=8, content="text", text="Paris").pseudo_tokens(prompt, vocab_size=320,
                                                                              model_type="llama", tokenizer=tokenizer)
    assert len(text) == 32
    ids = build("dapq", budget=8, content="tokens", token_ids=(5, 6)).pseudo_tokens(prompt, vocab_size=320,
                                                                                   model_type="llama")
    assert ids == [5, 6] * 16


def test_dapq_positions():
    assert build("dapq", budget=8).pseudo_positions(100) == list(range(100, 132))
    assert build("dapq", budget=8, position_offset=32).pseudo_positions(100)[0] == 132
    assert build("dapq", budget=8, inside_part=2).pseudo_positions(99)[0] == 33


def test_dapq_hybrid_spans_dapq_and_snapkv(llama):
    """The hybrid's mixing weight interpolates between two independent implementations."""
    import torch

    from conftest import random_prompt

    prompt = random_prompt(90, seed=13)
    dapq_only = kept_indices(llama, build("dapq_hybrid", budget=20, prompt_weight=0.0), prompt, TOKENIZER)
    snap_only = kept_indices(llama, build("dapq_hybrid", budget=20, prompt_weight=1.0, keep_recent=8), prompt, TOKENIZER)
    mixed = kept_indices(llama, build("dapq_hybrid", budget=20, prompt_weight=0.5, keep_recent=8), prompt, TOKENIZER)
    assert all(torch.equal(a, b) for a, b in zip(dapq_only, kept_indices(llama, build("dapq", budget=20), prompt, TOKENIZER), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(snap_only, kept_indices(llama, build("snapkv", budget=20), prompt, TOKENIZER), strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(mixed, snap_only, strict=True))
    assert build("dapq_hybrid", budget=8, window=4).observation().queries(90) == 36
    for bad in (dict(window=0), dict(prompt_weight=1.5)):
        with pytest.raises(ConfigError):
            build("dapq_hybrid", budget=8, **bad)


def test_dapq_pyramid_layer_budget():
    flat = build("dapq", budget=64)
    pyramid = build("dapq", budget=64, keep_recent=8, layer_budget="pyramid")
    assert flat.layer_budgets(1000, 30) == [64] * 30
    assert pyramid.layer_budgets(1000, 30) == pyramid_budgets(64, 8, 1000, 30)
    with pytest.raises(ConfigError):
        build("dapq", budget=64, layer_budget="steep")


def test_presets():
    paper = build("dapq", budget=64, preset="paper")
    assert (paper.content, paper.prefix, paper.keep_recent, paper.n_pseudo, paper.kernel) == ("prefix_suffix", None, 0, 32, 7)
    assert paper.split("llama") == (8, 24) and paper.split("qwen3") == (2, 30)  # Table 10 of the paper
    assert build("dapq", budget=64, preset="paper", keep_recent=8).keep_recent == 8  # explicit wins
    context = build("dapq", budget=64, preset="context")
    assert (context.position_offset, context.group_reduce, context.content) == (64, "layer", "fixed")
    with pytest.raises(ConfigError, match="no preset"):
        build("dapq", budget=64, preset="nope")
    with pytest.raises(ConfigError, match="no preset"):
        build("snapkv", budget=64, preset="paper")
