"""The engine on the test device: ``DAPQ_TEST_DEVICE=cuda`` runs these on a GPU (scripts/gpu-check.sh).

On the CPU (the default) each test compares the decode modes with each other; on another device
it also compares the device's kept sets and tokens with the CPU's, the same tiny models built
from the same seeds: exact in fp32, and in bf16 within the stated overlap.
"""

from __future__ import annotations

import os

import pytest
import torch

import dapq
from dapq.methods import available

from conftest import TOKENIZER, random_prompt, tiny_model

DEVICE = torch.device(os.environ.get("DAPQ_TEST_DEVICE", "cpu"))
METHODS = [name for name in available() if name != "oracle"]
PROMPTS = [random_prompt(n, seed=70 + n) for n in (90, 57, 120)]
NEW = 10
#: Fraction of kept (layer, head, token) entries bf16 on the device must share with fp32 on the
#: CPU: bf16 rounds scores that tie closely, so a few boundary tokens change places.
BF16_OVERLAP = 0.9


def _method(name):
    return dapq.build(name) if name == "full" else dapq.build(name, budget=24)


def _run(model, name, mode="auto"):
    method = _method(name)
    state = dapq.prefill(model, method, dapq.make_batch(model, method, PROMPTS, pad_id=0, tokenizer=TOKENIZER))
    kept = [layer.indices().cpu() for layer in state.cache.layers]
    out = dapq.generate(model, TOKENIZER, None, method, prompt_ids=PROMPTS, max_new_tokens=NEW, decode=mode)
    return kept, [r.token_ids for r in out]


@pytest.fixture(scope="module")
def models():
    cpu = tiny_model("llama")
    cpu.generation_config.eos_token_id = None
    dev = tiny_model("llama").to(DEVICE)
    dev.generation_config.eos_token_id = None
    return cpu, dev


@pytest.mark.parametrize("name", METHODS)
def test_device_fp32_keeps_and_decodes_what_the_cpu_does(models, name):
    cpu, dev = models
    kept, tokens = _run(dev, name)
    for mode in ("eager", "graph"):
        assert _run(dev, name, mode)[1] == tokens, mode
    if DEVICE.type != "cpu":
        ref_kept, ref_tokens = _run(cpu, name)
        assert all(torch.equal(a, b) for a, b in zip(kept, ref_kept, strict=True))
        assert tokens == ref_tokens


@pytest.mark.parametrize("name", ["dapq", "snapkv", "deferkv", "h2o"])
def test_device_bf16_keeps_nearly_what_fp32_keeps(models, name):
    cpu, _ = models
    half = tiny_model("llama").to(DEVICE, torch.bfloat16)
    half.generation_config.eos_token_id = None
    kept, _ = _run(half, name)
    ref, _ = _run(cpu, name)
    shared = sum(len(set(a[b, h].tolist()) & set(r[b, h].tolist())) for a, r in zip(kept, ref, strict=True)
                 for b in range(a.shape[0]) for h in range(a.shape[1]))
    total = sum(r.numel() for r in ref)
    assert shared / total >= BF16_OVERLAP, f"{shared}/{total}"
