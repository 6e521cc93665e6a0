"""A sweep's work units: the (method, budget) cells of a sample, how they run and what they record.

A :class:`WorkUnit` is picklable and model-free (a sample's prompt token ids and the method
configs of its pending cells); any executor of :mod:`dapq.runs.executor` runs it with
``unit.run(model, tokenizer)``, so a cell's prediction and score do not depend on where it ran.
The kvpress peers' units live with the kvpress integration
(:class:`dapq.integrations.kvpress_peer.PeerUnit`) and record through :func:`cell_record`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from ..context import ask, compress_context
from ..generation import generate, generate_many
from ..methods.spec import MethodSpec
from .metrics import score
from .tasks import Sample

# What a sweep ran in before records said so: float32 on the CPU (the defaults of the time).
DEFAULT_PRECISION = ("float32", "cpu")


@dataclass(frozen=True)
class Cell:
    """One (method, budget) cell of a sample, under the key its record is stored with."""

    key: str
    spec: MethodSpec
    budget: int | None
    keep_fraction: float | None = None

    def method(self):
        return self.spec.build(self.budget, self.keep_fraction)

    @property
    def size(self) -> str:
        """The budget, the kept fraction, or "all"."""
        if self.budget is not None:
            return str(self.budget)
        return f"{self.keep_fraction:g}" if self.keep_fraction is not None else "all"


class CellGroup:
    """What the units of a sample's cells share: their keys, which the writer checks off."""

    cells: tuple[Cell, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(c.key for c in self.cells)


@dataclass(frozen=True)
class WorkUnit(CellGroup):
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
    precision: tuple[str, str] = DEFAULT_PRECISION
    """The (dtype, device type) the sweep runs in: recorded with each cell."""

    @property
    def label(self) -> str:
        s = self.sample
        if self.shared_prefill:
            return f"{s.task} {s.sample_id}: {len(self.cells)} cells, one prefill"
        cell = self.cells[0]
        return f"{cell.spec.label} budget={cell.size} {s.task}"

    def run(self, model, tokenizer) -> list[dict]:
        """The scored records of the unit's cells: the only place a sweep's cells are computed."""
        return run_cells(model, tokenizer, self)


def run_cells(model, tokenizer, unit: WorkUnit) -> list[dict]:
    """Run a work unit's cells on a loaded model, in one shared prefill or one prefill each."""
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
            records.append(cell_record(unit, cell, method.config(), result, wall))
        return records
    for cell, method in zip(unit.cells, methods, strict=True):
        start = time.perf_counter()
        if question is None:
            result = generate(model, tokenizer, [s.prompt], method, prompt_ids=[list(unit.prompt_ids)], **sampling)[0]
        else:
            ctx = compress_context(model, tokenizer, [], method, context_ids=[list(unit.prompt_ids)])
            result = ask(model, tokenizer, ctx, [], question_ids=[question], **sampling)[0]
        records.append(cell_record(unit, cell, method.config(), result, time.perf_counter() - start))
    return records


def cell_record(unit, cell: Cell, config: dict, result, wall_s: float) -> dict:
    """The stored record of one finished cell: the result, its score, and what produced it."""
    s = unit.sample
    text = result.text.lstrip("\n").split("\n")[0] if s.meta.get("first_line") else result.text
    return {
        "key": cell.key, "model": unit.model_id, "taskset": s.taskset, "task": s.task, "sample_id": s.sample_id,
        "label": cell.spec.label, "method": cell.spec.name, "budget": cell.budget, "keep_fraction": cell.keep_fraction,
        "compress": unit.compress, "peer": cell.spec.peer, "config": config,
        "prediction": result.text, "references": list(s.references), "metric": s.metric,
        "score": score(s.metric, text, s.references, **s.metric_args), "prompt_tokens": result.prompt_tokens,
        "question_tokens": result.question_tokens, "prefill_s": result.prefill_s, "compress_s": result.compress_s,
        "decode_tokens_per_s": result.decode_tokens_per_s, "kv_bytes_full": result.kv_bytes_full,
        "kv_bytes_kept": result.kv_bytes_kept, "wall_s": wall_s,
        "shared_prefill": getattr(unit, "shared_prefill", False), "meta": json.loads(json.dumps(s.meta)),
        "dtype": unit.precision[0], "device": unit.precision[1],
    }


