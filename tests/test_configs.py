"""The shipped architecture configs of --random-weights, at their models' real context lengths."""

from __future__ import annotations

import pytest
import torch

from dapq.models import random_model_config


def _rope(config) -> dict:
    # transformers 5 keeps RoPE settings in rope_parameters; the configs state them as rope_scaling.
    return dict(getattr(config, "rope_parameters", None) or config.rope_scaling)


@pytest.mark.parametrize(("name", "positions", "rope_type"), [
    ("llama-3.1-8b", 131072, "llama3"), ("qwen2.5-7b", 131072, "yarn"), ("llama-3-8b", 8192, "default")])
def test_shipped_configs_reach_their_real_context(name, positions, rope_type):
    config = random_model_config(name)
    assert config.max_position_embeddings == positions
    assert _rope(config)["rope_type"] == rope_type


def test_llama3_scaling_changes_the_long_wavelengths_only():
    """The rotary embedding of the llama-3.1-8b config is Llama 3's: high frequencies as in Llama 3,
    low frequencies divided by the factor 8 (the published scaling)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    inv = {}
    for name in ("llama-3-8b", "llama-3.1-8b"):
        config = random_model_config(name)
        inv[name] = LlamaRotaryEmbedding(config).inv_freq
    assert torch.allclose(inv["llama-3.1-8b"][:8], inv["llama-3-8b"][:8])
    assert torch.allclose(inv["llama-3.1-8b"][-8:], inv["llama-3-8b"][-8:] / 8)
