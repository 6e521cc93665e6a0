"""Work units and executors: what a unit holds, and the single writer's handling of re-runs."""

from __future__ import annotations

import pickle
import subprocess
import sys

from dapq.bench.runner import Sweep, run_sweep, work_units
from dapq.bench.store import ResultsStore
from dapq.bench.tasks import TaskArgs, build_samples
from dapq.bench.units import WorkUnit
from dapq.methods.spec import parse_methods
from dapq.runs.executor import LocalExecutor, write_results

from conftest import tiny_model
from helpers import save_tiny


def _sweep(tokenizer, depths=(0.0, 1.0)):
    samples = build_samples("niah", tokenizer, TaskArgs(lengths=(200,), samples=1, depths=depths))
    return samples, parse_methods("full,dapq,snapkv"), [16, 32]


def _units(tokenizer, samples, methods, budgets, store, **options):
    return work_units(tokenizer, Sweep(tuple(samples), tuple(methods), tuple(budgets), model_id="tiny", **options),
                      store)


def test_units_group_the_pending_cells_of_a_sample(tmp_path, tokenizer):
    samples, methods, budgets = _sweep(tokenizer)
    store = ResultsStore(tmp_path)
    shared = _units(tokenizer, samples, methods, budgets, store)
    assert [u.sample.sample_id for u in shared] == [s.sample_id for s in samples]
    assert all(len(u.cells) == 5 for u in shared)  # full + 2 methods x 2 budgets, one prefill
    per_cell = _units(tokenizer, samples, methods, budgets, store, shared_prefill=False)
    assert len(per_cell) == 10 and all(len(u.cells) == 1 for u in per_cell)
    assert {k for u in per_cell for k in u.keys} == {k for u in shared for k in u.keys}
    # A unit is shipped to workers: it pickles, and holds token ids and configs, not a model.
    again = pickle.loads(pickle.dumps(shared[0]))
    assert again == shared[0] and isinstance(again.prompt_ids, tuple)
    store.append({"key": shared[0].keys[0]})
    pending = {u.sample.sample_id: u for u in _units(tokenizer, samples, methods, budgets, store)}
    first = pending[shared[0].sample.sample_id]
    assert len(first.cells) == 4 and shared[0].keys[0] not in first.keys
    assert pending[shared[1].sample.sample_id].keys == shared[1].keys


class _Twice:
    """An executor that hands back every unit twice, like one whose worker died after finishing."""

    def __init__(self, model, tokenizer):
        self.inner = LocalExecutor(model, tokenizer)

    def run(self, units, on_start=None):
        for unit, records in self.inner.run(units, on_start):
            yield unit, records
            yield unit, [dict(r, prediction="second run") for r in records]


def test_the_writer_records_each_cell_once(tmp_path, tokenizer):
    model = tiny_model("llama", max_position_embeddings=1024)
    samples, methods, budgets = _sweep(tokenizer)
    local = ResultsStore(tmp_path / "local")
    assert run_sweep(model, tokenizer, samples, methods, budgets, local, model_id="tiny", show_progress=False) == 10
    twice = ResultsStore(tmp_path / "twice")
    ran = run_sweep(None, tokenizer, samples, methods, budgets, twice, model_id="tiny", show_progress=False,
                    executor=_Twice(model, tokenizer), max_context=1024)
    lines = twice.path.read_text().splitlines()[1:]
    assert ran == 10 and len(lines) == 10
    assert {r["key"]: r["prediction"] for r in twice} == {r["key"]: r["prediction"] for r in local}


def test_a_unit_runs_to_what_the_local_runner_records(tmp_path, tokenizer):
    model = tiny_model("llama", max_position_embeddings=1024)
    samples, methods, budgets = _sweep(tokenizer, depths=(0.5,))
    store = ResultsStore(tmp_path)
    (unit,) = _units(tokenizer, samples, methods, budgets, store)
    assert isinstance(unit, WorkUnit)
    records = unit.run(model, tokenizer)
    assert write_results(LocalExecutor(model, tokenizer), [unit], store, show_progress=False) == 5
    strip = lambda r: {k: v for k, v in r.items() if not k.endswith("_s") and k != "decode_tokens_per_s"}  # noqa: E731
    assert [strip(r) for r in records] == [strip(r) for r in store]


def test_a_local_sweep_never_imports_ray(tmp_path, tokenizer):
    model_dir = save_tiny(tmp_path / "model", tokenizer, max_position_embeddings=1024)
    code = (
        "import sys\nfrom dapq.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "print('RAY IMPORTED' if 'ray' in sys.modules else 'NO RAY', file=sys.stderr)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, "bench", "niah", "--model", model_dir, "--lengths", "200", "--samples", "1",
         "--depths", "0", "--methods", "full,snapkv", "--budgets", "16", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr.strip().endswith("NO RAY")
    assert len(ResultsStore.open_existing(tmp_path / "out")) == 2
