"""The speed benchmark's measuring code: fake clocks and tiny models, no timing assertions."""

from __future__ import annotations

import json
import time

import pytest
import torch

from dapq.bench import speed
from dapq.bench.speed import PeakMemory, SpeedConfig, SpeedRun, measure
from dapq.bench.speed_report import render_speed, turn_ratio
from dapq.bench.store import ResultsStore
from dapq.compress import make_batch, prefill
from dapq.decoding import DecodeStepper
from dapq.errors import DapqError
from dapq.integrations.kvpress_peer import press_kwargs, run_kvpress
from dapq.methods import build
from dapq.methods.spec import parse_methods
from dapq.timing import Timing

from conftest import TOKENIZER, random_prompt, tiny_model
from helpers import import_kvpress, run_cli, save_tiny

TINY = SpeedConfig(context=48, budget=8, lengths=(24, 48), batches=(1, 2, 4), decode_tokens=3, repeats=2,
                   warmup=1, parts=("ttft", "decode", "e2e"))


class FakeClock:
    """A clock that only moves when the code under test says so."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_measure_excludes_warmup_and_reports_median_and_spread():
    clock = FakeClock()
    durations = iter([50.0, 3.0, 1.0, 2.0])  # the first call is the warm-up

    def fn():
        clock.now += next(durations)
        return clock.now

    timing, results = measure(fn, repeats=3, warmup=1, clock=clock)
    assert timing.samples == [3.0, 1.0, 2.0]
    assert timing.median == 2.0 and timing.spread == (1.0, 3.0)
    assert len(results) == 3 and results[0] == 153.0
    assert Timing([]).to_dict()["samples"] == []


def test_round_robin_takes_turns_and_drops_a_method_that_runs_out_of_memory():
    clock, calls = FakeClock(), []

    def fn(label, cost):
        def run():
            calls.append(label)
            if label == "b" and calls.count("b") == 3:
                raise torch.OutOfMemoryError("CUDA out of memory")
            clock.now += cost
            return label
        return run

    out = speed.measure_round_robin({"a": fn("a", 1.0), "b": fn("b", 2.0), "c": fn("c", 3.0)}, repeats=3,
                                    warmup=1, clock=clock)
    # Warm-ups, then turns with the order rotated each round; b leaves after its OOM.
    assert calls == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a"]
    assert out["a"][0].samples == [1.0, 1.0, 1.0] and out["c"][0].samples == [3.0, 3.0, 3.0]
    assert isinstance(out["b"], torch.OutOfMemoryError)
    with pytest.raises(ValueError):
        speed.measure_round_robin({"x": lambda: int("bug")}, repeats=1, warmup=0)  # bugs are not results


def test_peak_memory_catches_a_short_spike():
    level = {"v": 100}
    with PeakMemory("cpu", interval=0.001, read=lambda: level["v"]) as mem:
        level["v"] = 500
        time.sleep(0.2)
        level["v"] = 120
    assert mem.baseline == 100
    assert mem.peak == 500


def test_is_oom():
    assert speed.is_oom(torch.OutOfMemoryError("CUDA out of memory"))
    assert speed.is_oom(MemoryError())
    assert not speed.is_oom(ValueError("shape mismatch"))


@pytest.mark.parametrize("name", ["dapq", "pyramidkv", "snapkv"])
def test_repeated_state_decodes_like_the_single_one(llama, name):
    method = build(name, budget=8)
    prompt = random_prompt(40)
    single = prefill(llama, method, make_batch(llama, method, [prompt], pad_id=0, tokenizer=TOKENIZER))
    many = single.repeat(3)
    assert many.cache.kv_bytes() == 3 * single.cache.kv_bytes()
    tokens = [5, 9, 11]
    with DecodeStepper(llama, many, len(tokens)) as step:
        rep = [step(torch.tensor([t] * 3)) for t in tokens]
    with DecodeStepper(llama, single, len(tokens)) as step:
        one = [step(torch.tensor([t])) for t in tokens]
    for r, o in zip(rep, one, strict=True):
        torch.testing.assert_close(r, o.expand(3, -1), rtol=1e-5, atol=1e-5)


def test_decode_cell_figures(llama):
    method = build("dapq", budget=8)
    single = prefill(llama, method, make_batch(llama, method, [random_prompt(48)], pad_id=0, tokenizer=TOKENIZER))
    widths = [layer.keys.shape[2] for layer in single.cache.layers]
    clock = FakeClock()
    real_step = DecodeStepper.__call__

    def timed_step(self, token):
        clock.now += 0.5  # every decode step "takes" half a second
        return real_step(self, token)

    DecodeStepper.__call__ = timed_step
    try:
        out = speed.decode_cell(llama, single, 4, TINY, clock=clock)
    finally:
        DecodeStepper.__call__ = real_step
    assert out["decode_s"]["median"] == pytest.approx(TINY.decode_tokens * 0.5)
    assert out["tokens_per_s"] == pytest.approx(4 / 0.5)
    # KV bytes held follow budget / Lp exactly.
    assert out["kv_bytes_kept"] / out["kv_bytes_full"] == pytest.approx(8 / 48)
    assert out["kept_per_layer"] == [8] * llama.config.num_hidden_layers
    # The single state is untouched: repeats crop their own copy, not the prefill's.
    assert [layer.keys.shape[2] for layer in single.cache.layers] == widths


def _run(model, tmp_path, **kw):
    specs = parse_methods(kw.pop("methods", "full,dapq,snapkv"))
    store = ResultsStore(tmp_path / "speed")
    cfg = kw.pop("cfg", TINY)
    run = SpeedRun(model, None, specs, store, cfg, model_id="tiny", echo=lambda _: None, **kw)
    run.run()
    return store


def test_sweep_is_resumable_and_complete(llama, tmp_path):
    store = _run(llama, tmp_path)
    cells = [(r["cell"], r["label"], r.get("context"), r["batch"]) for r in store]
    assert len(cells) == len(set(cells))
    assert {c for c in cells if c[0] == "ttft"} == {("ttft", m, n, 1) for m in ("full", "dapq", "snapkv")
                                                    for n in (24, 48)}
    assert sum(c[0] == "decode" for c in cells) == 9 and sum(c[0] == "e2e" for c in cells) == 3
    ttft = next(r for r in store if r["cell"] == "ttft" and r["label"] == "dapq")
    assert len(ttft["ttft_s"]["samples"]) == TINY.repeats
    # Forward and compression are parts of the wall time.
    assert ttft["forward_s"]["median"] + ttft["compress_s"]["median"] <= ttft["ttft_s"]["median"] * 1.001
    n = len(store)
    again = _run(llama, tmp_path)
    assert len(again) == n  # nothing re-ran


def test_out_of_memory_is_a_result_and_the_sweep_goes_on(llama, tmp_path, monkeypatch):
    real = speed.decode_cell

    def failing(model, single, batch, cfg, **kw):
        if batch >= 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        return real(model, single, batch, cfg, **kw)

    monkeypatch.setattr(speed, "decode_cell", failing)
    store = _run(llama, tmp_path, cfg=SpeedConfig(**{**TINY.__dict__, "parts": ("decode",)}))
    for label in ("full", "dapq", "snapkv"):
        batches = {r["batch"]: r for r in store if r["label"] == label}
        assert set(batches) == {1, 2}  # batch 4 is skipped after the OOM at 2
        assert "tokens_per_s" in batches[1] and batches[2]["oom"]
    report = render_speed(list(store))
    assert "OOM" in report


def test_predicted_oom_on_cpu_never_runs_the_cell(llama, tmp_path, monkeypatch):
    monkeypatch.setattr(speed, "decode_cell", lambda *a, **k: pytest.fail("must not run"))
    cfg = SpeedConfig(**{**TINY.__dict__, "parts": ("decode",), "memory_limit": 1})
    store = _run(llama, tmp_path, methods="full", cfg=cfg)
    (record,) = list(store)
    assert record["oom"] and record["predicted"] and record["need_bytes"] > record["limit_bytes"]


def _rec(cell, label, session="s1", budget=8, **fields):
    return {"key": f"{cell}{label}{fields}{session}", "analysis": "speed", "taskset": "speed", "cell": cell,
            "model": "m", "device": "cpu", "dtype": "float32", "label": label, "method": label.split("-")[-1],
            "budget": None if label == "full" else budget, "session": session, **fields}


def test_report_ratios_are_side_by_side():
    t = lambda v: {"median": v, "min": v, "max": v, "samples": [v]}  # noqa: E731
    records = [
        _rec("ttft", "full", context=100, batch=1, ttft_s=t(2.0), forward_s=t(2.0), compress_s=t(0.0)),
        _rec("ttft", "dapq", context=100, batch=1, ttft_s=t(2.1), forward_s=t(2.0), compress_s=t(0.04)),
        _rec("ttft", "full", session="old", context=100, batch=1, ttft_s=t(9.0), forward_s=t(9.0),
             compress_s=t(0.0)),
        _rec("decode", "full", context=100, batch=2, tokens_per_s=10.0, kv_bytes_kept=100, kv_bytes_full=100,
             peak_bytes=2**30),
        _rec("decode", "dapq", context=100, batch=2, tokens_per_s=25.0, kv_bytes_kept=8, kv_bytes_full=100,
             peak_bytes=2**29),
        _rec("e2e", "dapq", context=100, batch=1, e2e_s=t(3.0)),
        _rec("peer", "kvpress-snapkv", context=100, batch=1, e2e_s=t(6.0), ttft_s=t(4.2), tokens_per_s=5.0),
    ]
    text = render_speed(records)
    assert "2.100 (1.050x)" in text  # against the same session's FullKV, not the old one
    assert "25.0 (2.50x)" in text
    assert "| dapq | 8 | 0.0800 | 0.0800 |" in text  # KV kept equals budget / Lp
    assert "| dapq | kvpress-snapkv | 100 | 3.000 | 6.000 | 0.500 |" in text
    assert "5.0x at B=2" in text  # batched dapq against kvpress's one-at-a-time pipeline


def test_turn_ratio_is_the_median_of_per_round_ratios():
    # Round 3 ran twice as slow for both methods, round 2 for FullKV only: per-round ratios are
    # 1.1, 0.55, 1.1 (median 1.1), where the ratio of the medians says 1.1 / 2.0 = 0.55.
    full = {"median": 2.0, "samples": [1.0, 2.0, 2.0]}
    dapq = {"median": 1.1, "samples": [1.1, 1.1, 2.2]}
    assert turn_ratio(dapq, full) == pytest.approx(1.1)
    assert turn_ratio({"median": 3.0}, {"median": 2.0}) == pytest.approx(1.5)  # no samples: medians


def test_press_kwargs_keep_exactly_the_budget():
    compute_n_kept = import_kvpress().utils.compute_n_kept  # kvpress's own rule, not a copy of it

    for n in (100, 257, 999, 4095, 7999):
        for budget in (b for b in (16, 64, 128) if b < n):
            ratio = press_kwargs("snapkv", budget, n)["compression_ratio"]
            assert compute_n_kept(n, ratio) == budget


def _peer_spec(tmp_path, tokenizer, **over) -> dict:
    """A kvpress speed-child spec on a tiny saved model (skips, saying why, without kvpress)."""
    import_kvpress()
    spec = {"model": save_tiny(tmp_path / "m", tokenizer), "random_weights": None, "dtype": "float32",
            "device": "cpu", "attn": "sdpa", "threads": 1, "budget": 8, "decode_tokens": 3, "repeats": 2,
            "warmup": 0, "ids": random_prompt(40)}
    return {**spec, **over}


def test_kvpress_peer_runs_the_real_pipeline(tmp_path, tokenizer):
    spec = _peer_spec(tmp_path, tokenizer, presses=["snapkv", "streamingllm"], decode_tokens=4, warmup=1)
    rows = run_kvpress(spec, timeout=300)
    assert [r["label"] for r in rows] == ["kvpress-snapkv", "kvpress-streamingllm"], rows
    for row in rows:
        assert len(row["runs"]) == 2
        assert all(len(run["decode_steps_s"]) == 3 for run in row["runs"])  # T-1 steps after the question
        # Steps are whole iterations (forward, LM head, argmax) and end with the pipeline call.
        assert all(run["first_token_s"] + sum(run["decode_steps_s"]) <= run["e2e_s"] for run in row["runs"])
        assert row["tokens_per_s"] > 0 and row["e2e_s"]["median"] >= row["ttft_s"]["median"]
    bad = run_kvpress({**spec, "model": str(tmp_path / "missing")}, timeout=300)
    assert len(bad) == 1 and "error" in bad[0]


def test_cli_bench_speed(tmp_path, tokenizer, capsys):
    path = save_tiny(tmp_path / "m", tokenizer)
    out = tmp_path / "speed"
    code, stdout, _ = run_cli(capsys, "bench", "speed", "--model", path, "--methods", "full,dapq",
                              "--budget", "8", "--context", "40", "--lengths", "40", "--batches", "1,2",
                              "--decode-tokens", "3", "--repeats", "1", "--warmup", "0", "--peers", "none",
                              "--out", str(out))
    assert code == 0
    assert "Decode throughput" in stdout and "TTFT" in stdout
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()[1:]]
    assert {r["cell"] for r in records} == {"ttft", "decode", "e2e"}


def _kvpress_reachable() -> bool:
    from dapq.integrations.kvpress_peer import kvpress_python

    try:
        kvpress_python()  # the lookup `bench speed` itself uses: this interpreter or $DAPQ_KVPRESS_PYTHON
    except DapqError:
        return False
    return True


@pytest.mark.parametrize(("args", "needle"), [
    (["--parts", "nope"], "--parts"),
    (["--peers", "h2o"], "no kvpress peer"),
    (["--batches", "0"], "--batches"),
    (["--budget", "500", "--context", "100", "--lengths", "100"], "--budget"),
    (["--random-weights", "no-such-config"], "no-such-config"),
    (["--model", "x", "--random-weights", "llama-3-8b"], "not both"),
    (["--methods", "oracle"], "oracle"),
    # An explicit 0 used to fall back to the default (128, 4000, ...) and run.
    (["--budget", "0", "--lengths", "200", "--context", "300"], "--budget must lie in [1, 200)"),
    (["--context", "0", "--parts", "decode"], "--context must be >= 1"),
    (["--max-batch", "0", "--parts", "decode"], "--max-batch must be >= 1"),
    (["--parts", "peer", "--context", "300", "--peers", "kvpress:Nope"], "kvpress has no press 'Nope'"),
])
def test_cli_bench_speed_bad_input(tmp_path, capsys, args, needle):
    if needle.startswith("kvpress has no press") and not _kvpress_reachable():
        needle = "kvpress is not installed here"  # the check needs kvpress; without it, that is the one line
    code, _, err = run_cli(capsys, "bench", "speed", "--out", str(tmp_path / "o"), *args)
    assert code == 2
    assert err.startswith("dapq: error:") and needle in err and len(err.strip().splitlines()) == 1, err


def test_random_weights_from_a_config_file(tmp_path):
    from dapq.models import random_model, random_model_config

    cfg = random_model_config("llama-3-8b")
    assert (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.vocab_size) == (32, 8, 128256)
    assert random_model_config("qwen2.5-7b").model_type == "qwen2"
    tiny = tiny_model("llama").config.to_dict()
    (tmp_path / "c.json").write_text(json.dumps({**tiny, "_comment": "x"}))
    model = random_model(str(tmp_path / "c.json"), dtype="float32", device="cpu")
    assert model.config.hidden_size == tiny["hidden_size"] and model.dtype == torch.float32
    store = _run(model, tmp_path, methods="full,dapq", cfg=SpeedConfig(**{**TINY.__dict__, "parts": ("decode",),
                                                                          "batches": (1,)}))
    assert all(r["tokens_per_s"] > 0 for r in store)


def test_any_kvpress_press_as_a_speed_peer_with_its_prefill_cost(tmp_path, tokenizer):
    spec = _peer_spec(tmp_path, tokenizer, presses=["kvpress:TOVAPress", "none"])
    rows = {r["label"]: r for r in run_kvpress(spec, timeout=300)}
    assert set(rows) == {"kvpress-kvpress:TOVAPress", "kvpress-none"}, rows
    tova, none = rows["kvpress-kvpress:TOVAPress"], rows["kvpress-none"]
    assert tova["press"] == "TOVAPress" and none["press"] is None and len(tova["runs"]) == len(none["runs"]) == 2
    paired = [a["prefill_s"] / b["prefill_s"] for a, b in zip(tova["runs"], none["runs"], strict=True)]
    assert tova["prefill_ratio_to_no_press"] == pytest.approx(sorted(paired)[0] / 2 + sorted(paired)[1] / 2)
    assert "prefill_ratio_to_no_press" not in none
    from dapq.integrations.kvpress_peer import speed_press

    with pytest.raises(DapqError, match="no kvpress peer"):
        speed_press("tova")


def test_kvpress_press_scoring_after_the_prefill_counts_as_compression(tmp_path, tokenizer):
    """KVzip replays the context in extra model passes after the prefill: its cost, not decoding."""
    spec = _peer_spec(tmp_path, tokenizer, presses=["kvpress:KVzipPress", "none"], repeats=1)
    rows = {r["label"]: r for r in run_kvpress(spec, timeout=300)}
    for row in rows.values():
        run = row["runs"][0]
        assert len(run["decode_steps_s"]) == 2, row  # T-1 steps after the question, whatever ran before it
        assert run["prefill_s"] < run["first_token_s"] < run["e2e_s"]
