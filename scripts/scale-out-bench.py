"""Wall time of one sweep with the local runner, 1 Ray worker and 2 Ray workers, side by side.

    python scripts/scale-out-bench.py time [--lengths 2000] [--samples 1] [--rounds 2] [--configs local,1,2]
                                           [--out FILE]
    python scripts/scale-out-bench.py compare DIR_A DIR_B

``time`` runs the same NIAH sweep (embedded model; full, dapq, snapkv at budgets 64 and 128; one
shared-prefill unit per prompt) in rounds, the order reversed every round (local, 1, 2, then 2, 1,
local, ...) so the drift of this shared machine hits every configuration alike. ``--configs``
picks the runners: ``local``, ``N`` (N Ray workers sharing the CPUs) or ``NxC`` (N workers of C
CPUs, i.e. torch threads, each: ``1x1`` against ``2`` compares equal threads per worker). Each sweep writes
a fresh results directory, so every cell runs. A local Ray with all the machine's CPUs is started
once; N workers get the CPUs split evenly (torch threads = CPU share). Two times are kept per
Ray sweep: ``total`` (actors started, model loaded, sweep run) and ``sweep`` (from the moment every
actor is ready: the steady state a long sweep sees). It prints every run, the medians, the
1-vs-2-worker ratio and the per-unit / per-cell costs, and writes them as JSON with ``--out``.

``compare`` checks two results directories cell by cell (prediction and score by key) and
renders both reports, which must be identical: the Ray-vs-local equality check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


def _sweep_inputs(lengths: tuple[int, ...], samples: int):
    from dapq.bench.tasks import TaskArgs, build_samples
    from dapq.methods.spec import parse_methods
    from dapq.models import ModelSpec

    spec = ModelSpec()  # the embedded SmolLM2-135M, fp32, CPU
    tokenizer, config = spec.load_tokenizer_and_config()
    args = TaskArgs(lengths=lengths, samples=samples, max_context=config.max_position_embeddings)
    return spec, tokenizer, config, build_samples("niah", tokenizer, args), parse_methods("full,dapq,snapkv")


@dataclass(frozen=True)
class _Empty:
    """A unit that does nothing but carry a real unit's payload: it times Ray's share of a unit."""

    payload: object

    @property
    def keys(self) -> tuple:
        return ()

    @property
    def label(self) -> str:
        return "empty"

    def run(self, model, tokenizer) -> list[dict]:
        return []


def _round_trip(ex, tokenizer, samples, methods, budgets, store, n: int = 30) -> dict:
    """Median seconds to ship a unit of this sweep to a worker and get an (empty) answer back."""
    import pickle

    from dapq.bench.runner import Sweep, work_units
    from dapq.bench.store import ResultsStore

    scratch = ResultsStore(Path(tempfile.mkdtemp(prefix="scale-out-rt-")))
    unit = work_units(tokenizer, Sweep(tuple(samples[:1]), tuple(methods), tuple(budgets), model_id="smollm2-135m"),
                      scratch)[0]
    scratch.close()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        list(ex.run([_Empty(unit)]))
        times.append(time.perf_counter() - start)
    records = list(store)[:5]
    return {"round_trip_s": statistics.median(times), "unit_bytes": len(pickle.dumps(unit)),
            "records_bytes_per_cell": len(pickle.dumps(records)) / len(records)}


def cmd_time(ns) -> None:
    import ray
    import torch

    from dapq.bench.runner import run_sweep
    from dapq.bench.store import ResultsStore
    from dapq.integrations.ray import RayExecutor, connect

    spec, tokenizer, config, samples, methods = _sweep_inputs(tuple(ns.lengths), ns.samples)
    budgets = [64, 128]
    ctx = config.max_position_embeddings
    cpus = os.cpu_count()
    connect(None, num_cpus=cpus)
    model, _ = spec.on("cpu").load()
    torch.set_num_threads(cpus)
    runs: list[dict] = []
    configs = ns.configs.split(",")
    overhead = None
    for rnd in range(ns.rounds):
        for cfg in configs if rnd % 2 == 0 else configs[::-1]:
            out = Path(tempfile.mkdtemp(prefix=f"scale-out-{cfg}-"))
            store = ResultsStore(out)
            start = time.perf_counter()
            if cfg == "local":
                run_sweep(model, tokenizer, samples, methods, budgets, store, model_id="smollm2-135m",
                          show_progress=False)
                total = sweep = time.perf_counter() - start
            else:
                workers, _, per = cfg.partition("x")  # "2": CPUs split evenly; "1x1": 1 worker, 1 CPU
                with RayExecutor(spec, workers=int(workers), cpus_per_worker=float(per) if per else None) as ex:
                    ex.start()  # every actor has loaded the model
                    ready = time.perf_counter()
                    run_sweep(None, tokenizer, samples, methods, budgets, store, model_id="smollm2-135m",
                              show_progress=False, executor=ex, max_context=ctx)
                    end = time.perf_counter()
                    if overhead is None:
                        overhead = _round_trip(ex, tokenizer, samples, methods, budgets, store)
                total, sweep = end - start, end - ready
            records = list(store)
            store.close()
            runs.append({"round": rnd, "config": str(cfg), "total_s": total, "sweep_s": sweep, "cells": len(records),
                         "units": len({r["sample_id"] for r in records}),
                         "cell_wall_s": statistics.median(r["wall_s"] for r in records),
                         "prefill_s": statistics.median(r["prefill_s"] for r in records if r["method"] == "full")})
            print(json.dumps(runs[-1]), flush=True)
    summary = {}
    for cfg in configs:
        mine = [r for r in runs if r["config"] == cfg]
        summary[cfg] = {k: statistics.median(r[k] for r in mine) for k in ("total_s", "sweep_s", "cell_wall_s")}
    cells, units = runs[0]["cells"], runs[0]["units"]
    print(f"\nNIAH {ns.lengths} x {len(samples)} prompts: {units} units, {cells} cells; {cpus} CPUs; "
          f"medians of {ns.rounds} rounds")
    print("| runner | sweep wall s | total wall s (with actor start) | s per unit | s per cell |")
    print("|---|---|---|---|---|")
    for cfg in configs:
        s = summary[cfg]
        print(f"| {_label(cfg, cpus)} | {s['sweep_s']:.1f} | {s['total_s']:.1f} | {s['sweep_s'] / units:.2f} | "
              f"{s['sweep_s'] / cells:.2f} |")
    ones = [c for c in configs if c.split("x")[0] == "1"]
    if ones and "2" in summary:
        for one_cfg in ones:
            one, two = summary[one_cfg], summary["2"]
            print(f"\n{_label(one_cfg, cpus)} / {_label('2', cpus)}: sweep {one['sweep_s'] / two['sweep_s']:.2f}x, "
                  f"total {one['total_s'] / two['total_s']:.2f}x; actor start-up {one['total_s'] - one['sweep_s']:.1f} s "
                  f"vs {two['total_s'] - two['sweep_s']:.1f} s")
    if overhead is not None:
        print(f"Ray's share of one unit: {overhead['round_trip_s'] * 1000:.1f} ms round trip (median of 30 empty "
              f"units carrying a real unit's payload); a unit pickles to {overhead['unit_bytes'] / 1024:.0f} KiB, "
              f"a cell's record to {overhead['records_bytes_per_cell'] / 1024:.1f} KiB")
    if ns.out:
        Path(ns.out).write_text(json.dumps({"runs": runs, "summary": summary, "overhead": overhead, "cpus": cpus,
                                            "lengths": ns.lengths, "samples": ns.samples}, indent=1) + "\n")
    ray.shutdown()


def _label(cfg: str, cpus: int) -> str:
    if cfg == "local":
        return f"local runner ({cpus} threads)"
    workers, _, per = cfg.partition("x")
    per = per or str(max(1, cpus // int(workers)))
    return f"Ray, {workers} worker{'s' if workers != '1' else ''} x {per} thread{'s' if per != '1' else ''}"


def cmd_compare(ns) -> None:
    from dapq.bench.report import render
    from dapq.bench.store import ResultsStore

    a = {r["key"]: r for r in ResultsStore.open_existing(ns.a)}
    b_lines = list(ResultsStore.open_existing(ns.b))
    b = {r["key"]: r for r in b_lines}
    same = [k for k in a if k in b and (a[k]["prediction"], a[k]["score"]) == (b[k]["prediction"], b[k]["score"])]
    print(f"{ns.a}: {len(a)} cells; {ns.b}: {len(b_lines)} records, {len(b)} distinct keys")
    print(f"keys only in A: {len(set(a) - set(b))}, only in B: {len(set(b) - set(a))}; "
          f"equal prediction and score: {len(same)} of {len(a)}")
    for k in sorted(set(a) & set(b)):
        if k not in same:
            print(f"  differs: {k} {a[k]['label']} {a[k]['budget']} {a[k]['sample_id']}: "
                  f"{a[k]['prediction']!r} vs {b[k]['prediction']!r}")
    reports = [render(d, plots=False).replace(str(d), "DIR") for d in (ns.a, ns.b)]
    print("reports identical:", reports[0] == reports[1])
    ok = len(same) == len(a) == len(b) == len(b_lines) and reports[0] == reports[1]
    sys.exit(0 if ok else 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("time")
    t.add_argument("--lengths", type=int, nargs="+", default=[2000])
    t.add_argument("--samples", type=int, default=1)
    t.add_argument("--rounds", type=int, default=2)
    t.add_argument("--configs", default="local,1,2", help="comma list: local, N (N workers sharing the CPUs) "
                   "or NxC (N workers of C CPUs each)")
    t.add_argument("--out")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    ns = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    {"time": cmd_time, "compare": cmd_compare}[ns.cmd](ns)


if __name__ == "__main__":
    main()
