"""DapQPress in kvpress's own pipeline keeps what dapq's DapQ keeps in context-only mode."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from dapq import compat
from dapq.context import compress_context
from dapq.methods import build
from dapq.prompts import encode_context

from conftest import TOKENIZER, tiny_model
from helpers import import_kvpress, kept_columns

kvpress = import_kvpress()

CONTEXT = ("The grass is green. The sky is blue. The sun is yellow. Here we go. One of the special magic "
           "numbers for sleepy-owl is: 4817263. There and back again. Paris is the capital of France. ") * 3


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize(("ratio", "params"), [(0.75, {}), (0.5, {"preset": "paper"}),
                                               (0.6, {"content": "random_vocab", "keep_recent": 4})])
def test_dapq_press_keeps_dapq_context_mode_tokens(kind, ratio, params):
    from dapq.integrations.kvpress import DapQPress

    model = tiny_model(kind, seed=7)
    model.generation_config.eos_token_id = None
    pipe = kvpress.KVPressTextGenerationPipeline(model=model, tokenizer=TOKENIZER)
    press = DapQPress(compression_ratio=ratio, tokenizer=TOKENIZER, **params)
    cache = DynamicCache()
    pipe(CONTEXT, question=" What is green?", press=press, cache=cache, max_new_tokens=2)

    ids = encode_context(TOKENIZER, CONTEXT, chat=True)  # the pipeline's own split, checked below
    assert pipe.preprocess(CONTEXT, [""], "", 10**6)["context_ids"][0].tolist() == ids
    n_kept = kvpress.utils.compute_n_kept(len(ids), ratio)
    ours = compress_context(model, TOKENIZER, [], build("dapq", budget=n_kept, **params), context_ids=[ids])
    full = DynamicCache()
    compat.forward(model, torch.tensor([ids]), position_ids=torch.arange(len(ids))[None], cache=full, first_column=0)
    assert cache.get_seq_length() == n_kept < len(ids)
    for layer_idx, layout in enumerate(ours.state.cache.layers):
        assert kept_columns(cache, full, layer_idx) == layout.kept_indices[0].tolist(), f"layer {layer_idx}"


def test_dapq_press_without_compression_is_plain_kvpress():
    from dapq.integrations.kvpress import DapQPress

    model = tiny_model("llama", seed=7)
    pipe = kvpress.KVPressTextGenerationPipeline(model=model, tokenizer=TOKENIZER)
    plain = pipe(CONTEXT, question=" What is green?", max_new_tokens=4)["answer"]
    assert pipe(CONTEXT, question=" What is green?", press=DapQPress(tokenizer=TOKENIZER), max_new_tokens=4)[
        "answer"] == plain
