"""Work units and the executors that run them: in this process, or spread over Ray actors.

A sweep or a bulk generation is cut into *work units*: picklable, model-free descriptions of a
piece of work that know how to run themselves on a loaded model (``unit.run(model, tokenizer)``)
and name the keys of the records they produce. An *executor* runs units and yields
``(unit, records)`` as they finish, in completion order. The caller (:func:`write_results`) is the
only writer of the output log: it appends each record it has not seen yet and advances the
progress bar. So one runner serves every executor, and an executor that runs a unit twice (a
worker died after finishing part of it) cannot record anything twice.

:class:`LocalExecutor` runs units one after the other on a model of this process;
:class:`dapq.integrations.ray.RayExecutor` runs them on N Ray actors that each load the model
once. Both call ``unit.run``, so a record does not depend on where it ran.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from .log import JsonlLog


@runtime_checkable
class Unit(Protocol):
    """What an executor runs: picklable, holding configs and data, never a model."""

    @property
    def keys(self) -> tuple: ...

    @property
    def label(self) -> str: ...

    def run(self, model, tokenizer) -> list[dict]: ...


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
            yield unit, unit.run(self.model, self.tokenizer)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_bar(show: bool) -> Progress:
    """The sweep's progress bar: done/total, elapsed, and the ETA from the rate so far."""
    # On stderr: a table printed to stdout (or redirected to a file) must not carry the bar. Only on
    # a terminal: a log file would get one frozen frame at the end, in front of any error line.
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("eta"), TimeRemainingColumn(), disable=not (show and sys.stderr.isatty()), transient=False,
        console=Console(file=sys.stderr),
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
