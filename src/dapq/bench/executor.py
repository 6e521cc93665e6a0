"""Work units and the executors that run them: in this process, or spread over Ray actors.

A sweep (or a bulk generation) is cut into *work units*: picklable, model-free descriptions of a
piece of work (a sample's prompt token ids and the method configs of its pending cells). An
*executor* runs units on a loaded model and yields ``(unit, records)`` as units finish, in
completion order. The caller (:func:`write_results`) is the only writer of the results file: it
appends each record it has not seen yet and advances the progress bar. So the one runner,
:func:`~dapq.bench.runner.run_sweep`, serves every executor, and an executor that runs a unit
twice (a worker died after finishing part of it) cannot record a cell twice.

:class:`LocalExecutor` runs units one after the other on a model of this process;
:class:`dapq.integrations.ray.RayExecutor` runs them on N Ray actors that each load the model
once. Both call :func:`run_unit`, so a cell's prediction and score do not depend on where it ran.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from ..generation import generate, generate_many
from .metrics import score
from .tasks import Sample

if TYPE_CHECKING:
    from .runner import MethodSpec
    from .store import JsonlLog


@runtime_checkable
class Unit(Protocol):
    """What an executor runs: picklable, holding configs and data, never a model."""

    @property
    def keys(self) -> tuple: ...

    @property
    def label(self) -> str: ...

    def run(self, model, tokenizer) -> list[dict]: ...


@dataclass(frozen=True)
class Cell:
    """One (method, budget) cell of a sample, under the key its record is stored with."""

    key: str
    spec: MethodSpec
    budget: int | None

    def method(self):
        return self.spec.build(self.budget)


@dataclass(frozen=True)
class WorkUnit:
    """Pending cells of one sample, run together on one worker.

    With ``shared_prefill`` the unit is every pending (method, budget) cell of the sample: one
    FullKV prefill, compressed per method (:func:`~dapq.generation.generate_many`), so the
    one-prefill-per-prompt saving survives any split of a sweep over workers. Without it a unit
    is one cell (its own prefill + compression + decode).
    """

    sample: Sample
    prompt_ids: tuple[int, ...]
    cells: tuple[Cell, ...]
    model_id: str
    shared_prefill: bool = True
    decode_batch: int = 8

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(c.key for c in self.cells)

    @property
    def label(self) -> str:
        s = self.sample
        if self.shared_prefill:
            return f"{s.task} {s.sample_id}: {len(self.cells)} cells, one prefill"
        cell = self.cells[0]
        return f"{cell.spec.label} budget={cell.budget or 'all'} {s.task}"

    def run(self, model, tokenizer) -> list[dict]:
        return run_unit(model, tokenizer, self)


def run_unit(model, tokenizer, unit) -> list[dict]:
    """Run one work unit on a loaded model: the scored records of its cells.

    This is the only place where a sweep's cells are computed, whichever executor runs them.
    Units of other kinds (bulk generation) bring their own ``run``.
    """
    if not isinstance(unit, WorkUnit):
        return unit.run(model, tokenizer)
    s = unit.sample
    methods = [c.method() for c in unit.cells]
    records = []
    if unit.shared_prefill:
        start = time.perf_counter()
        results = generate_many(model, tokenizer, list(unit.prompt_ids), methods,
                                max_new_tokens=s.max_new_tokens, stop=s.stop, max_batch=unit.decode_batch)
        wall = (time.perf_counter() - start) / len(methods)
        for cell, method, result in zip(unit.cells, methods, results, strict=True):
            records.append(_record(unit, cell, method, result, wall))
    else:
        for cell, method in zip(unit.cells, methods, strict=True):
            start = time.perf_counter()
            result = generate(model, tokenizer, [s.prompt], method, prompt_ids=[list(unit.prompt_ids)],
                              max_new_tokens=s.max_new_tokens, stop=s.stop)[0]
            records.append(_record(unit, cell, method, result, time.perf_counter() - start))
    return records


def _record(unit: WorkUnit, cell: Cell, method, result, wall_s: float) -> dict:
    s = unit.sample
    text = result.text.lstrip("\n").split("\n")[0] if s.meta.get("first_line") else result.text
    return {
        "key": cell.key, "model": unit.model_id, "taskset": s.taskset, "task": s.task, "sample_id": s.sample_id,
        "label": cell.spec.label, "method": cell.spec.name, "budget": cell.budget, "config": method.config(),
        "prediction": result.text, "references": list(s.references), "metric": s.metric,
        "score": score(s.metric, text, s.references, **s.metric_args), "prompt_tokens": result.prompt_tokens,
        "prefill_s": result.prefill_s, "compress_s": result.compress_s,
        "decode_tokens_per_s": result.decode_tokens_per_s, "kv_bytes_full": result.kv_bytes_full,
        "kv_bytes_kept": result.kv_bytes_kept, "wall_s": wall_s, "shared_prefill": unit.shared_prefill,
        "meta": json.loads(json.dumps(s.meta)),
    }


class Executor(Protocol):
    """Runs work units and yields ``(unit, records)`` as each one finishes (completion order).

    ``on_start(unit)`` is called when a unit starts (or is handed to a worker). An executor may
    run a unit more than once (after a worker died); the caller drops records it already has.
    """

    def run(self, units: Sequence[Unit], on_start: Callable[[Unit], None] | None = None
            ) -> Iterator[tuple[Unit, list[dict]]]: ...


class LocalExecutor:
    """Run units one after the other on a model loaded in this process."""

    def __init__(self, model, tokenizer):
        self.model = model
        self.tokenizer = tokenizer

    def run(self, units: Sequence[Unit], on_start: Callable[[Unit], None] | None = None
            ) -> Iterator[tuple[Unit, list[dict]]]:
        for unit in units:
            if on_start is not None:
                on_start(unit)
            yield unit, run_unit(self.model, self.tokenizer, unit)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_bar(show: bool) -> Progress:
    """The sweep's progress bar: done/total, elapsed, and the ETA from the rate so far."""
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("eta"), TimeRemainingColumn(), disable=not show, transient=False,
    )


def write_results(executor: Executor, units: Iterable[Unit], log: JsonlLog, *, show_progress: bool = True,
                  description: str = "sweep") -> int:
    """Run ``units`` on ``executor`` and append every new record to ``log``. Returns records written.

    This loop is the only writer: each record is appended (and fsynced) as its unit finishes, so
    an interrupted run keeps everything that had finished, and a record whose key is already in
    ``log`` (a unit that ran again after a worker died) is dropped, never written twice.
    """
    units = list(units)
    total = sum(len(u.keys) for u in units)
    written = 0
    progress = progress_bar(show_progress)
    with progress:
        bar = progress.add_task(description, total=total)

        def started(unit) -> None:
            progress.update(bar, description=unit.label)

        for _unit, records in executor.run(units, on_start=started):
            for record in records:
                if record[log.key_field] in log:
                    continue
                log.append(record)
                written += 1
                progress.advance(bar)
    return written
