"""Tiny random models and a tokenizer built in code: no download, seconds per test."""

from __future__ import annotations

import pytest
import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

torch.set_num_threads(2)

CORPUS = [
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.",
    "One of the special magic numbers for sleepy-owl is: 4817263.",
    "What is the special magic number mentioned in the provided text? Sorry, I don't know.",
    "Paris is the capital of France. Berlin is the capital of Germany. 0123456789",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|user|>{{ m['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _tokenizer() -> PreTrainedTokenizerFast:
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 4, vocab_size=320, special_tokens=["<pad>", "<eos>", "<|user|>", "<|assistant|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, pad_token="<pad>", eos_token="<eos>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


TOKENIZER = _tokenizer()
"""The test tokenizer, for id-level tests whose method needs one (DapQ's default text content)."""


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return TOKENIZER


def tiny_config(kind: str = "llama", **overrides):
    common = dict(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        # A wider init than the default 0.02 makes the random model's logits peaky, so greedy
        # decoding has no near-ties that float noise could flip.
        initializer_range=0.15,
        pad_token_id=0,
        eos_token_id=1,
    )
    common.update(overrides)
    configs = {"llama": LlamaConfig, "qwen3": Qwen3Config, "qwen2": Qwen2Config, "mistral": MistralConfig}
    if kind in ("qwen2", "mistral"):
        common.pop("head_dim")  # derived from hidden_size / heads = 16
    return configs[kind](**common)


def tiny_model(kind: str = "llama", attn: str = "sdpa", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(kind, **overrides), attn_implementation=attn)
    return model.eval()


@pytest.fixture(scope="session")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="session")
def llama_eager():
    return tiny_model("llama", attn="eager")


@pytest.fixture(scope="session")
def qwen3():
    return tiny_model("qwen3")


@pytest.fixture(params=["llama", "qwen3"])
def any_model(request, llama, qwen3):
    return {"llama": llama, "qwen3": qwen3}[request.param]


def random_prompt(length: int, seed: int = 0, vocab: int = 320) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (length,), generator=gen).tolist()


# ---- model directories, for the command-line tests (tests/cli)
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    """A tiny random Llama and the test tokenizer, saved as a model directory."""
    from helpers import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny-llama"), tokenizer, max_position_embeddings=256)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, tokenizer):
    """An architecture dapq does not support, saved as a model directory."""
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("tiny-gpt2")
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=320)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
