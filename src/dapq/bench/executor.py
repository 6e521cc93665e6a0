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

from ..context import ask, compress_context
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
    ratio: float | None = None

    def method(self):
        return self.spec.build(self.budget, self.ratio)

    @property
    def size(self) -> str:
        """The budget, the kept fraction, or "all"."""
        return str(self.budget) if self.budget is not None else f"{self.ratio:g}" if self.ratio is not None else "all"


class _Cells:
    """What the units of a sample's cells share: their keys, which the writer checks off."""

    cells: tuple[Cell, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(c.key for c in self.cells)


@dataclass(frozen=True)
class WorkUnit(_Cells):
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
    question_ids: tuple[int, ...] | None = None
    """With ``compress="context"``: the question fed uncompressed after ``prompt_ids`` (the context)."""
    compress: str = "prompt"

    @property
    def label(self) -> str:
        s = self.sample
        if self.shared_prefill:
            return f"{s.task} {s.sample_id}: {len(self.cells)} cells, one prefill"
        cell = self.cells[0]
        return f"{cell.spec.label} budget={cell.size} {s.task}"

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
    sampling = dict(max_new_tokens=s.max_new_tokens, stop=s.stop)
    question = None if unit.question_ids is None else list(unit.question_ids)
    records = []
    if unit.shared_prefill:
        start = time.perf_counter()
        results = generate_many(model, tokenizer, list(unit.prompt_ids), methods, max_batch=unit.decode_batch,
                                question_ids=question, **sampling)
        wall = (time.perf_counter() - start) / len(methods)
        for cell, method, result in zip(unit.cells, methods, results, strict=True):
            records.append(_record(unit, cell, method.config(), result, wall))
        return records
    for cell, method in zip(unit.cells, methods, strict=True):
        start = time.perf_counter()
        if question is None:
            result = generate(model, tokenizer, [s.prompt], method, prompt_ids=[list(unit.prompt_ids)], **sampling)[0]
        else:
            ctx = compress_context(model, tokenizer, [], method, context_ids=[list(unit.prompt_ids)])
            result = ask(model, tokenizer, ctx, [], question_ids=[question], **sampling)[0]
        records.append(_record(unit, cell, method.config(), result, time.perf_counter() - start))
    return records


def _record(unit, cell: Cell, config: dict, result, wall_s: float) -> dict:
    """The stored record of one finished cell: the result, its score, and what produced it."""
    s = unit.sample
    text = result.text.lstrip("\n").split("\n")[0] if s.meta.get("first_line") else result.text
    return {
        "key": cell.key, "model": unit.model_id, "taskset": s.taskset, "task": s.task, "sample_id": s.sample_id,
        "label": cell.spec.label, "method": cell.spec.name, "budget": cell.budget, "ratio": cell.ratio,
        "compress": unit.compress, "peer": cell.spec.peer, "config": config,
        "prediction": result.text, "references": list(s.references), "metric": s.metric,
        "score": score(s.metric, text, s.references, **s.metric_args), "prompt_tokens": result.prompt_tokens,
        "question_tokens": result.question_tokens, "prefill_s": result.prefill_s, "compress_s": result.compress_s,
        "decode_tokens_per_s": result.decode_tokens_per_s, "kv_bytes_full": result.kv_bytes_full,
        "kv_bytes_kept": result.kv_bytes_kept, "wall_s": wall_s,
        "shared_prefill": getattr(unit, "shared_prefill", False), "meta": json.loads(json.dumps(s.meta)),
    }


@dataclass(frozen=True)
class PeerUnit(_Cells):
    """The kvpress cells of one sample: each through kvpress's own pipeline, in a child process.

    The child (:func:`dapq.integrations.kvpress_peer.session`) loads ``model`` once per worker and
    gets the same token ids as dapq's cells of the sample: the context and the question in
    context mode; in prompt mode the prompt minus its last token, then that token as the question
    (so the first new token comes from the same position as dapq's). The budget or ratio maps to
    the ``compression_ratio`` that keeps as many context tokens per KV head as dapq's methods do.
    """

    sample: Sample
    prompt_ids: tuple[int, ...]
    question_ids: tuple[int, ...] | None
    cells: tuple[Cell, ...]
    model_id: str
    model: dict
    """``ModelSpec.peer_fields()``: what the child loads."""
    compress: str = "prompt"

    @property
    def label(self) -> str:
        return f"{self.sample.task} {self.sample.sample_id}: {len(self.cells)} kvpress cells"

    def run(self, model, tokenizer) -> list[dict]:
        import torch

        from ..generation import GenerationResult
        from ..integrations.kvpress_peer import compression_ratio, kept_tokens, session

        s = self.sample
        if self.question_ids is None:
            context, question = list(self.prompt_ids[:-1]), list(self.prompt_ids[-1:])
        else:
            context, question = list(self.prompt_ids), list(self.question_ids)
        child = session({**self.model, "threads": torch.get_num_threads()})
        records = []
        for cell in self.cells:
            n_kept = kept_tokens(len(context), cell.budget, cell.ratio)
            kwargs = {**dict(cell.spec.params), "compression_ratio": compression_ratio(n_kept, len(context))}
            answer = child.generate({"press": cell.spec.name.split(":", 1)[1], "kwargs": kwargs,
                                     "context_ids": context, "question_ids": question,
                                     "max_new_tokens": s.max_new_tokens})
            text = answer["text"]
            cuts = [text.index(stop) for stop in s.stop if stop in text]
            text = text[: min(cuts)] if cuts else text
            # The pipeline leaves the compressed context in the cache: KV bytes as dapq counts them.
            per_token, kept = answer["token_bytes"], answer["kept"]
            result = GenerationResult(
                text=text, token_ids=[], prompt_tokens=len(context), method=cell.spec.name, budget=cell.budget,
                kept_tokens_per_head=kept, kv_bytes_full=per_token * len(context) * len(kept),
                kv_bytes_kept=per_token * sum(kept), prefill_s=answer["seconds"], compress_s=0.0, decode_s=0.0,
                decode_tokens_per_s=0.0, finish_reason="", question_tokens=len(question))
            config = {**cell.spec.config(cell.budget, cell.ratio), "compression_ratio": kwargs["compression_ratio"],
                      "kvpress_version": child.kvpress_version}
            if sum(answer.get("masked", ())):
                # Held in memory but never attended: the KV bytes stay physical, this says how much is dead.
                config["masked_fraction"] = sum(answer["masked"]) / (sum(kept) * answer["kv_heads"])
            records.append(_record(self, cell, config, result, answer["seconds"]))
        return records


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
