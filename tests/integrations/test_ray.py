"""Scale-out on Ray, checked against the local runner on tiny models built in code.

One local Ray (2 CPUs, no dashboard) serves the whole module, and one executor with two actors
serves the in-process tests, so actors load their model once.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'dapq[ray]'); scale-out tests skipped")

from dapq.bench.runner import run_sweep  # noqa: E402
from dapq.bench.store import ResultsStore  # noqa: E402
from dapq.bench.tasks import TaskArgs, build_samples  # noqa: E402
from dapq.generation import SamplingConfig, generate  # noqa: E402
from dapq.methods.spec import parse_methods  # noqa: E402
from dapq.models import ModelSpec  # noqa: E402
from dapq.runs.executor import LocalExecutor  # noqa: E402

from conftest import TOKENIZER, tiny_model  # noqa: E402
from helpers import run_cli, save_tiny  # noqa: E402

CONTEXT = 1024
METHODS = "full,dapq,snapkv"
BUDGETS = [16, 32]
REQUESTS = [
    {"id": "a", "prompt": "The grass is green. The sky is blue. What color is the sky?"},
    {"id": 2, "messages": [{"role": "user", "content": "Paris is the capital of France."}], "method": "snapkv"},
    {"id": "c", "prompt": "One of the special magic numbers for sleepy-owl is: 4817263.", "method": "full"},
    {"id": "d", "prompt": "There and back again. The sun is yellow.", "keep_fraction": 0.5},
    {"id": "e", "prompt": "Berlin is the capital of Germany. 0123456789 Here we go.", "budget": 6},
]


def tiny_loader(spec: ModelSpec, marker: str | None = None):
    """A Ray worker's model: the tiny Llama (same seed, same weights in every process).

    With ``marker``, the worker's process exits (``os._exit``: no cleanup, like a kill) at a
    decode step once the marker file exists and this worker has prefilled at least once; the
    worker that manages to delete the marker is the only one to die.
    """
    model = tiny_model("llama", max_position_embeddings=CONTEXT)
    if marker is not None:
        seen = {"prefills": 0}

        def die_mid_cell(module, args, kwargs):
            width = kwargs["input_ids"].shape[1] if kwargs.get("input_ids") is not None else 0
            if width > 64:
                seen["prefills"] += 1
            elif width == 1 and seen["prefills"] and os.path.exists(marker):
                try:
                    os.remove(marker)
                except FileNotFoundError:
                    return None  # another worker took it
                os._exit(1)
            return None

        model.register_forward_pre_hook(die_mid_cell, with_kwargs=True)
    return model, TOKENIZER


@pytest.fixture(scope="module")
def ray_local():
    here = Path(__file__).parent
    # Workers import the loader above by module name: give them this directory and tests/.
    path = os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning",
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def marker(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fault") / "die-now"


@pytest.fixture(scope="class")
def executor(ray_local, marker):
    """Two actors (one CPU each: all of this Ray), stopped before the CLI tests start their own."""
    from dapq.integrations.ray import RayExecutor

    spec = ModelSpec(loader=functools.partial(tiny_loader, marker=str(marker)))
    with RayExecutor(spec, workers=2, echo=lambda msg: print(msg, file=sys.stderr)) as ex:
        yield ex


@pytest.fixture(scope="module")
def sweep():
    samples = build_samples("niah", TOKENIZER, TaskArgs(lengths=(200,), samples=1, depths=(0.0, 0.33, 0.66, 1.0)))
    return samples, parse_methods(METHODS)


@pytest.fixture(scope="module")
def local_records(sweep, tmp_path_factory):
    samples, methods = sweep
    store = ResultsStore(tmp_path_factory.mktemp("local"))
    run_sweep(tiny_model("llama", max_position_embeddings=CONTEXT), TOKENIZER, samples, methods, BUDGETS, store,
              model_id="tiny", show_progress=False)
    return {r["key"]: r for r in store}


def _lines(store: ResultsStore) -> list[dict]:
    return [json.loads(line) for line in store.path.read_text().splitlines()[1:]]


def _same_cells(records: list[dict], local: dict) -> None:
    keys = [r["key"] for r in records]
    assert len(keys) == len(set(keys)), "a cell was recorded twice"
    assert set(keys) == set(local), "lost or extra cells"
    for r in records:
        assert (r["prediction"], r["score"], r["kv_bytes_kept"]) == (
            local[r["key"]]["prediction"], local[r["key"]]["score"], local[r["key"]]["kv_bytes_kept"])


class TestExecutor:
    def test_ray_sweep_equals_the_local_sweep(self, executor, sweep, local_records, tmp_path):
        samples, methods = sweep
        store = ResultsStore(tmp_path)
        ran = run_sweep(None, TOKENIZER, samples, methods, BUDGETS, store, model_id="tiny", show_progress=False,
                        executor=executor, max_context=CONTEXT)
        assert ran == len(local_records) == len(samples) * 5
        _same_cells(_lines(store), local_records)
        assert len({r["prediction"] for r in store}) > 3  # the methods disagree: the comparison has teeth
        # A sample's cells ran as one unit (one prefill, one generate_many call), so they share its wall time.
        walls: dict = {}
        for r in store:
            walls.setdefault(r["sample_id"], set()).add(r["wall_s"])
        assert len(walls) == len(samples) and all(len(w) == 1 for w in walls.values())

    def test_a_worker_killed_mid_cell_loses_and_repeats_nothing(self, executor, sweep, local_records, marker,
                                                                tmp_path):
        samples, methods = sweep
        store = ResultsStore(tmp_path)
        deaths = executor.deaths
        marker.touch()  # the next worker to decode after a prefill exits with os._exit(1)
        ran = run_sweep(None, TOKENIZER, samples, methods, BUDGETS, store, model_id="tiny", show_progress=False,
                        executor=executor, max_context=CONTEXT)
        assert not marker.exists() and executor.deaths == deaths + 1  # exactly one worker died
        assert ran == len(local_records)
        _same_cells(_lines(store), local_records)
        # The executor stays usable: its replacement actor serves the next run.
        again = ResultsStore(tmp_path / "again")
        assert run_sweep(None, TOKENIZER, samples[:1], methods, BUDGETS, again, model_id="tiny", show_progress=False,
                         executor=executor, max_context=CONTEXT) == 5

    def test_bulk_generation_resumes_on_ray(self, executor, tmp_path):
        from dapq.bulk import GenerationLog, MethodDefaults, encode_requests, read_requests, run_bulk

        src = tmp_path / "prompts.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in REQUESTS))
        requests = encode_requests(read_requests(src, MethodDefaults(budget=8)), TOKENIZER, src, max_context=CONTEXT)
        sampling = SamplingConfig(max_new_tokens=6)
        model = tiny_model("llama", max_position_embeddings=CONTEXT)
        with GenerationLog(tmp_path / "local.jsonl") as local:
            run_bulk(LocalExecutor(model, TOKENIZER), requests, local, sampling=sampling, show_progress=False)
        first = (tmp_path / "local.jsonl").read_text().splitlines()
        out = tmp_path / "ray.jsonl"
        out.write_text("\n".join(first[:2]) + '\n{"id": "x", "te')  # two finished, then a kill in mid-line
        with GenerationLog(out) as log:
            assert run_bulk(executor, requests, log, sampling=sampling, batch_size=2, show_progress=False) == 3
        lines = out.read_text().splitlines()
        assert lines[:2] == first[:2]  # finished records are neither rerun nor rewritten
        records = [json.loads(line) for line in lines]
        assert sorted(str(r["id"]) for r in records) == sorted(str(r["id"]) for r in REQUESTS)  # each id once
        local = {r["id"]: r for r in map(json.loads, first)}
        assert {r["id"]: (r["text"], r["kv_bytes_kept"], r["config"]) for r in records} == {
            i: (r["text"], r["kv_bytes_kept"], r["config"]) for i, r in local.items()}

    def test_an_interrupted_driver_resumes_from_the_store(self, executor, sweep, local_records, tmp_path):
        samples, methods = sweep
        store = ResultsStore(tmp_path)
        real, calls = store.append, {"n": 0}

        def interrupted(record):
            calls["n"] += 1
            if calls["n"] == 7:  # mid-way through the second unit's records
                raise KeyboardInterrupt
            real(record)

        store.append = interrupted
        with pytest.raises(KeyboardInterrupt):
            run_sweep(None, TOKENIZER, samples, methods, BUDGETS, store, model_id="tiny", show_progress=False,
                      executor=executor, max_context=CONTEXT)
        assert len(ResultsStore.open_existing(tmp_path)) == 6
        store.close()
        resumed = ResultsStore(tmp_path)
        ran = run_sweep(None, TOKENIZER, samples, methods, BUDGETS, resumed, model_id="tiny", show_progress=False,
                        executor=executor, max_context=CONTEXT)  # the actors were stopped: new ones start
        assert ran == len(local_records) - 6
        _same_cells(_lines(resumed), local_records)


def test_cli_ray_sweep_and_report_equal_the_local_ones(ray_local, tmp_path, capsys):
    model_dir = save_tiny(tmp_path / "model", TOKENIZER, max_position_embeddings=CONTEXT)
    common = ["bench", "niah", "--model", model_dir, "--lengths", "200", "--samples", "1", "--depths", "0,1",
              "--methods", METHODS, "--budgets", ",".join(map(str, BUDGETS))]
    assert run_cli(capsys, *common, "--out", str(tmp_path / "local"))[0] == 0
    code, _, err = run_cli(capsys, *common, "--out", str(tmp_path / "ray"), "--ray", "--workers", "2")
    assert code == 0, err
    local = {r["key"]: r for r in ResultsStore.open_existing(tmp_path / "local")}
    _same_cells(_lines(ResultsStore.open_existing(tmp_path / "ray")), local)
    reports = [run_cli(capsys, "report", str(tmp_path / d), "--no-plots")[1] for d in ("local", "ray")]
    assert reports[0].replace(str(tmp_path / "local"), "D") == reports[1].replace(str(tmp_path / "ray"), "D")


def test_map_batches_class_on_a_ray_dataset(ray_local):
    from dapq.integrations.ray import GenerateBatch

    prompts = ["The grass is green. The sky is blue.", "Paris is the capital of France. Berlin is",
               "One of the special magic numbers for sleepy-owl is: 4817263.", "There and back again."]
    ds = ray.data.from_items([{"id": i, "prompt": p} for i, p in enumerate(prompts)])
    out = ds.map_batches(
        GenerateBatch, fn_constructor_kwargs={"model_spec": ModelSpec(loader=tiny_loader), "method": "snapkv",
                                              "budget": 8, "max_new_tokens": 6},
        compute=ray.data.ActorPoolStrategy(size=1), batch_size=2,
    ).take_all()
    model, tok = tiny_loader(ModelSpec())
    from dapq.methods import build

    method = build("snapkv", budget=8)
    by_id = {row["id"]: row for row in out}
    assert sorted(by_id) == list(range(len(prompts)))
    for i, prompt in enumerate(prompts):
        alone = generate(model, tok, [prompt], method, max_new_tokens=6)[0]
        row = by_id[i]
        assert (row["prompt"], row["text"], row["kv_bytes_kept"]) == (prompt, alone.text, alone.kv_bytes_kept)
        assert json.loads(row["config"]) == method.config() and row["method"] == "snapkv"


def test_ray_errors_are_one_line(ray_local, tmp_path, capsys):
    code, _, err = run_cli(capsys, "bench", "niah", "--out", str(tmp_path / "a"), "--workers", "2")
    assert code == 2 and "need --ray" in err and err.count("\n") == 1
    shutil.rmtree(tmp_path / "a", ignore_errors=True)
    code, _, err = run_cli(capsys, "bench", "niah", "--out", str(tmp_path / "b"), "--ray", "--gpus-per-worker", "1")
    assert code == 2 and "GPU" in err and err.count("\n") == 1


def test_an_unreachable_head_is_refused_within_the_timeout(tmp_path):
    import socket
    import subprocess
    import time

    from dapq.errors import DapqError
    from dapq.integrations.ray import check_reachable

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    for address, needle in ((f"127.0.0.1:{closed}", "refused"), ("nosuchhost.invalid:6379", "cannot reach"),
                            ("somewhere", "HOST:PORT")):
        start = time.monotonic()
        with pytest.raises(DapqError, match=needle):
            check_reachable(address, timeout=1)
        assert time.monotonic() - start < 5
    with socket.socket() as s:  # a listening head passes
        s.bind(("127.0.0.1", 0))
        s.listen()
        check_reachable(f"ray://127.0.0.1:{s.getsockname()[1]}", timeout=1)
    # From the command line: one line and exit 2, in seconds rather than Ray's ten minutes.
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "dapq.cli", "bench", "niah", "--ray=nosuchhost.invalid:1", "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DAPQ_RAY_CONNECT_TIMEOUT": "2"})
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "cannot reach the Ray cluster at nosuchhost.invalid:1" in done.stderr and time.monotonic() - start < 90
