"""The results store and the runner: resume after a kill, refuse foreign or corrupt files."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

import dapq.bench.units as executor
from dapq.bench.runner import parse_budgets, run_sweep
from dapq.bench.store import ResultsStore
from dapq.bench.tasks import TaskArgs, build_samples
from dapq.errors import ConfigError, DapqError
from dapq.methods.spec import parse_methods

from conftest import tiny_model
from helpers import lock_held_by_another_process, run_cli

FIX = Path(__file__).parent / "fixtures" / "sweep"


def test_store_round_trip_and_torn_last_line(tmp_path, capsys):
    store = ResultsStore(tmp_path)
    store.append({"key": "a", "score": 1.0})
    store.append({"key": "b", "score": 0.0})
    with open(store.path, "a") as fh:
        fh.write('{"key": "c", "sco')  # killed in mid-write
    again = ResultsStore(tmp_path)
    assert [r["key"] for r in again] == ["a", "b"] and "c" not in again
    assert "torn" in capsys.readouterr().err
    again.append({"key": "c", "score": 0.5})
    assert [json.loads(line)["key"] for line in store.path.read_text().splitlines()[1:]] == ["a", "b", "c"]


def test_a_whole_last_record_without_its_newline_is_kept_and_its_line_completed(tmp_path, capsys):
    store = ResultsStore(tmp_path)
    store.append({"key": "a", "score": 1.0})
    with open(store.path, "a") as fh:
        fh.write('{"key": "b", "score": 0.5}')  # complete, but its newline never reached the disk
    assert [r["key"] for r in ResultsStore.open_existing(tmp_path)] == ["a", "b"]  # a reader keeps it too
    again = ResultsStore(tmp_path)
    assert [r["key"] for r in again] == ["a", "b"] and "torn" not in capsys.readouterr().err
    again.append({"key": "c", "score": 0.0})
    lines = store.path.read_text().splitlines()[1:]
    assert [json.loads(line) for line in lines] == [{"key": "a", "score": 1.0}, {"key": "b", "score": 0.5},
                                                   {"key": "c", "score": 0.0}]


def test_a_deleted_output_stops_its_writer_instead_of_sharing_the_new_one(tmp_path):
    out = tmp_path / "sweep"
    first = ResultsStore(out)
    first.append({"key": "a"})
    shutil.rmtree(out)  # deleted while the first run writes
    second = ResultsStore(out)  # a second run takes the new directory's lock
    second.append({"key": "a"})
    with pytest.raises(DapqError, match="deleted or replaced while this run wrote it"):
        first.append({"key": "b"})
    second.append({"key": "b"})
    assert [r["key"] for r in ResultsStore.open_existing(out)] == ["a", "b"]  # one writer, no duplicates
    first.close()
    second.close()


def test_duplicate_keys_count_once_in_a_resume_and_a_report(tmp_path, capsys):
    store = ResultsStore(tmp_path)
    for key, score in (("a", 0.0), ("b", 1.0), ("a", 1.0)):  # two writers once appended "a" twice
        store.append({"key": key, "score": score})
    assert store.path.read_text().count("\n") == 4
    store.close()
    again = ResultsStore.open_existing(tmp_path)
    assert len(again) == 2 and again.get("a")["score"] == 1.0 and [r["key"] for r in again] == ["a", "b"]
    assert "1 duplicate record(s)" in capsys.readouterr().err


def test_store_refuses_foreign_and_corrupt_files(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "results.jsonl").write_text('{"something": "else"}\n')
    with pytest.raises(DapqError, match="not a dapq results file"):
        ResultsStore(foreign)
    assert (foreign / "results.jsonl").read_text() == '{"something": "else"}\n'  # untouched
    corrupt = tmp_path / "corrupt"
    store = ResultsStore(corrupt)
    store.append({"key": "a"})
    store.append({"key": "b"})
    lines = store.path.read_text().splitlines()
    store.path.write_text("\n".join([lines[0], "garbage{", lines[2]]) + "\n")
    with pytest.raises(DapqError, match=":2: corrupt"):
        ResultsStore(corrupt)


@pytest.mark.parametrize("content", [b"", b'{"format": "dapq-re'])
def test_a_run_killed_before_its_first_record_leaves_a_usable_directory(tmp_path, content):
    (tmp_path / "results.jsonl").write_bytes(content)  # created, then killed in the header
    assert len(ResultsStore(tmp_path, writable=False)) == 0
    with ResultsStore(tmp_path) as store:
        assert len(store) == 0
        store.append({"key": "a"})
    assert [r["key"] for r in ResultsStore(tmp_path)] == ["a"]


def test_the_lock_refuses_a_second_writer_and_dies_with_its_holder(tmp_path, capsys):
    out = tmp_path / "sweep"
    out.mkdir()
    shutil.copy(FIX / "results.jsonl", out / "results.jsonl")
    before = (out / "results.jsonl").read_bytes()
    with lock_held_by_another_process("from dapq.bench.store import ResultsStore\ns = ResultsStore(sys.argv[1])", out):
        with pytest.raises(DapqError, match="another dapq process is writing here"):
            ResultsStore(out)
        code, stdout, err = run_cli(capsys, "bench", "niah", "--out", str(out), "--methods", "full")
        assert code == 2 and err.count("\n") == 1 and "another dapq process" in err and not stdout
        code, stdout, _ = run_cli(capsys, "report", str(out), "--no-plots")  # readers take no lock
        assert code == 0 and "## niah" in stdout
        assert (out / "results.jsonl").read_bytes() == before  # the refused writer touched nothing
    # The holder was killed (as a crashed run would be): the kernel dropped its lock.
    with ResultsStore(out) as store:
        assert len(store) == before.count(b"\n") - 1
        store.append({"key": "after"})
    assert "after" in ResultsStore(out)


def test_a_reader_leaves_a_torn_line_to_the_writer(tmp_path, capsys):
    store = ResultsStore(tmp_path)
    store.append({"key": "a"})
    with open(store.path, "a") as fh:
        fh.write('{"key": "b", "sc')  # a running writer in mid-line
    raw = store.path.read_bytes()
    assert [r["key"] for r in ResultsStore.open_existing(tmp_path)] == ["a"]
    assert store.path.read_bytes() == raw and "unfinished" in capsys.readouterr().err
    with pytest.raises(DapqError, match="read-only"):
        ResultsStore.open_existing(tmp_path).append({"key": "c"})


def test_parse_methods_and_budgets():
    specs = parse_methods("full,dapq(keep_recent=8,content='random_vocab'),snapkv")
    assert [s.name for s in specs] == ["full", "dapq", "snapkv"]
    assert specs[1].build(32).keep_recent == 8 and specs[1].build(32).content == "random_vocab"
    assert parse_budgets("64, 128") == [64, 128]
    for bad in ("64,x", "0", ""):
        with pytest.raises(ConfigError):
            parse_budgets(bad)
    for bad in ("bogus", "dapq(windw=3)", "dapq(window)"):
        with pytest.raises(ConfigError):
            parse_methods(bad)


@pytest.mark.parametrize("shared", [False, True])
def test_sweep_resumes_after_a_kill(tmp_path, tokenizer, monkeypatch, shared):
    model = tiny_model("llama", max_position_embeddings=1024)
    samples = build_samples("niah", tokenizer, TaskArgs(lengths=(200,), samples=1, depths=(0.0, 1.0)))
    methods, budgets = parse_methods("full,dapq,snapkv"), [16, 32]
    per_sample = 1 + 2 * len(budgets)
    n_cells = len(samples) * per_sample
    # Per-cell runs call generate() once a cell; shared-prefill runs call generate_many() once a prompt.
    name, dies_at, finished = ("generate_many", 2, per_sample) if shared else ("generate", 4, 3)
    calls = {"n": 0}
    real = getattr(executor, name)

    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == dies_at:
            raise KeyboardInterrupt  # the user pressed Ctrl-C
        return real(*args, **kwargs)

    monkeypatch.setattr(executor, name, dying)
    store = ResultsStore(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(model, tokenizer, samples, methods, budgets, store, model_id="tiny", show_progress=False,
                  shared_prefill=shared)
    assert len(ResultsStore(tmp_path)) == finished  # what finished before the kill is on disk
    monkeypatch.setattr(executor, name, real)
    store = ResultsStore(tmp_path)
    ran = run_sweep(model, tokenizer, samples, methods, budgets, store, model_id="tiny", show_progress=False,
                    shared_prefill=shared)
    assert ran == n_cells - finished and len(store) == n_cells
    assert run_sweep(model, tokenizer, samples, methods, budgets, ResultsStore(tmp_path), model_id="tiny",
                     show_progress=False, shared_prefill=shared) == 0
    record = next(iter(store))
    for key in ("model", "config", "task", "sample_id", "prediction", "references", "score", "prefill_s",
                "compress_s", "kv_bytes_full", "kv_bytes_kept"):
        assert key in record
    assert record["shared_prefill"] is shared


def test_shared_prefill_sweep_equals_one_prefill_per_cell(tmp_path, tokenizer):
    model = tiny_model("llama", max_position_embeddings=1024)
    samples = build_samples("niah", tokenizer, TaskArgs(lengths=(200,), samples=1, depths=(0.0, 0.5, 1.0)))
    methods = parse_methods("full,dapq,dapq(keep_recent=4),snapkv,pyramidkv,h2o,streamingllm,lacache")
    runs = {}
    for shared in (False, True):
        store = ResultsStore(tmp_path / str(shared))
        run_sweep(model, tokenizer, samples, methods, [16, 40], store, model_id="tiny", show_progress=False,
                  shared_prefill=shared, decode_batch=3)
        runs[shared] = {r["key"]: (r["prediction"], r["kv_bytes_kept"]) for r in store}
    assert len(runs[True]) == len(samples) * (1 + 7 * 2)
    assert runs[True] == runs[False]
    assert len({p for p, _ in runs[True].values()}) > 3  # the methods really disagree: the check has teeth


def test_unknown_taskset_and_too_long(tokenizer):
    with pytest.raises(DapqError, match="unknown task set"):
        build_samples("nope", tokenizer, TaskArgs())
    with pytest.raises(DapqError, match="longer than the model"):
        build_samples("niah", tokenizer, TaskArgs(lengths=(9000,), max_context=512))


@pytest.mark.parametrize("shared", [False, True])
def test_sample_stop_strings_cut_the_prediction(tmp_path, tokenizer, shared):
    # HELMET's newline stopping goes through Sample.stop: the stored prediction is the output
    # cut before the first stop string (a string this model is known to produce, found first).
    model = tiny_model("llama", max_position_embeddings=1024)
    (sample,) = build_samples("niah", tokenizer, TaskArgs(lengths=(200,), samples=1, depths=(0.5,)))
    free = ResultsStore(tmp_path / "free")
    run_sweep(model, tokenizer, [sample], parse_methods("full"), [16], free, model_id="tiny", show_progress=False,
              shared_prefill=shared)
    text = next(iter(free))["prediction"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert len(text) > 4 and stop and text.index(stop) > 0
    stopped = ResultsStore(tmp_path / "stopped")
    run_sweep(model, tokenizer, [dataclasses.replace(sample, stop=(stop,))], parse_methods("full"), [16], stopped,
              model_id="tiny", show_progress=False, shared_prefill=shared)
    assert next(iter(stopped))["prediction"] == text[: text.index(stop)]


def test_context_mode_cells_equal_the_context_api(tmp_path, tokenizer):
    """--compress context: each cell is compress_context + ask on the task's own split, shared or not."""
    from dapq.bench.runner import encode_sample
    from dapq.context import ask, compress_context

    model = tiny_model("llama", max_position_embeddings=1024)
    samples = build_samples("niah", tokenizer, TaskArgs(lengths=(200,), samples=1, depths=(0.0, 1.0)))
    methods = parse_methods("full,dapq,snapkv,deferkv")
    runs = {}
    for shared in (False, True):
        store = ResultsStore(tmp_path / str(shared))
        run_sweep(model, tokenizer, samples, methods, [16], store, model_id="tiny", show_progress=False,
                  shared_prefill=shared, compress="context", keep_fractions=[0.5])
        runs[shared] = {r["key"]: r for r in store}
    assert {k: r["prediction"] for k, r in runs[True].items()} == {k: r["prediction"] for k, r in runs[False].items()}
    records = list(runs[True].values())
    assert len(records) == len(samples) * (1 + 3 * 2)
    for r in records:
        s = next(s for s in samples if s.sample_id == r["sample_id"])
        context, question = encode_sample(tokenizer, s, "context")
        assert r["compress"] == "context" and r["question_tokens"] == len(question) > 0
        assert r["prompt_tokens"] == len(context)  # what was compressed: the context
        spec = next(m for m in methods if m.label == r["label"])
        ctx = compress_context(model, tokenizer, [], spec.build(r["budget"], r["keep_fraction"]), context_ids=[list(context)])
        direct = ask(model, tokenizer, ctx, [], question_ids=[list(question)], max_new_tokens=s.max_new_tokens)[0]
        assert r["prediction"] == direct.text
        if r["keep_fraction"] is not None:  # --keep-fractions keeps ceil(f * Lc) context tokens per KV head
            assert r["kv_bytes_kept"] / r["kv_bytes_full"] == pytest.approx(-(-len(context) // 2) / len(context))
    prompt_mode = ResultsStore(tmp_path / "prompt")
    run_sweep(model, tokenizer, samples, methods, [16], prompt_mode, model_id="tiny", show_progress=False)
    assert not set(runs[True]) & {r["key"] for r in prompt_mode}  # the mode is part of a cell's key
    assert {r["compress"] for r in prompt_mode} == {"prompt"}


def test_prompt_mode_keys_are_unchanged(tmp_path, tokenizer):
    """Results files written before --compress existed resume: prompt-mode keys did not change."""
    from dapq.bench.store import cell_key

    model = tiny_model("llama", max_position_embeddings=1024)
    (s,) = build_samples("niah", tokenizer, TaskArgs(lengths=(200,), samples=1, depths=(0.5,)))
    store = ResultsStore(tmp_path)
    run_sweep(model, tokenizer, [s], parse_methods("snapkv"), [16], store, model_id="tiny", show_progress=False)
    from dapq.methods import build

    old = cell_key(model="tiny", sample=s.sample_id, task=s.task, config=build("snapkv", budget=16).config(),
                   max_new_tokens=s.max_new_tokens, prompt=s.prompt, chat=s.chat)
    assert [r["key"] for r in store] == [old]


def test_context_mode_needs_a_question_part(tmp_path, tokenizer):
    model = tiny_model("llama", max_position_embeddings=1024)
    (s,) = build_samples("niah", tokenizer, TaskArgs(lengths=(200,), samples=1, depths=(0.5,)))
    with pytest.raises(DapqError, match="no question part"):
        run_sweep(model, tokenizer, [dataclasses.replace(s, context_end=None)], parse_methods("full"), [16],
                  ResultsStore(tmp_path), model_id="tiny", show_progress=False, compress="context")


def test_parse_keep_fractions():
    from dapq.bench.runner import cells, parse_keep_fractions

    assert parse_keep_fractions("0.25, 0.5") == [0.25, 0.5]
    for bad in ("0", "1", "1.5", "x", ""):
        with pytest.raises(ConfigError):
            parse_keep_fractions(bad)
    specs = parse_methods("full,snapkv")
    assert [(s.name, b, r) for s, b, r in cells(specs, [64], [0.5])] == [
        ("full", None, None), ("snapkv", 64, None), ("snapkv", None, 0.5)]


LEGACY = Path(__file__).parent / "fixtures" / "legacy-v1"
#: The methods of the legacy file, under today's names (it was written with window=16 for DapQ's
#: N, prompt_window, recent_tokens, H2O's window and --ratios).
TODAYS_NAMES = ("full,dapq,dapq(n_pseudo=16),dapq(preset='paper'),dapq_hybrid(window=4),snapkv(window=4),"
                "pyramidkv,h2o(keep_recent=4),streamingllm,lacache(keep_recent=8),deferkv(steps=2,window=4),random")


def test_a_results_file_from_before_the_rename_resumes_with_no_cell_recomputed(tmp_path, tokenizer, capsys):
    out = tmp_path / "old"
    shutil.copytree(LEGACY, out)
    before = (out / "results.jsonl").read_bytes()
    model = tiny_model("llama", max_position_embeddings=1024)
    samples = build_samples("niah", tokenizer, TaskArgs(lengths=(200,), samples=1, depths=(0.5,)))
    for mode in ("prompt", "context"):
        ran = run_sweep(model, tokenizer, samples, parse_methods(TODAYS_NAMES), [16], ResultsStore(out),
                        model_id="tiny", show_progress=False, keep_fractions=[0.5], compress=mode)
        assert ran == 0, mode
    assert (out / "results.jsonl").read_bytes() == before
    # A setting old files could not hold is a new cell, not a match of an old one.
    assert run_sweep(model, tokenizer, samples, parse_methods("snapkv(window=4,layer_budget='pyramid')"), [16],
                     ResultsStore(out), model_id="tiny", show_progress=False) == 1
    # The report reads the old records under today's names.
    records = list(ResultsStore.open_existing(out))
    assert all("ratio" not in r and "ratio" not in r["config"] for r in records)
    assert {r["label"] for r in records} >= {"dapq(n_pseudo=16)", "lacache(keep_recent=8)", "h2o(keep_recent=4)"}
    code, stdout, _ = run_cli(capsys, "report", str(out), "--no-plots")
    assert code == 0 and "| dapq(n_pseudo=16) | 16 |" in stdout and "| snapkv(window=4) | 50% |" in stdout
