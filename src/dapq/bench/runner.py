"""The sweep runner: every (method, budget, sample) cell, resumable through the results store.

There is one runner for every executor: it computes the pending cells, groups them into work
units, and writes what the executor (local or Ray, :mod:`dapq.bench.executor`) hands back.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from ..errors import ConfigError, DapqError
from ..generation import encode_prompts
from ..methods import build, method_class
from .executor import Cell, Executor, LocalExecutor, WorkUnit, write_results
from .store import ResultsStore, cell_key
from .tasks import Sample


@dataclass(frozen=True)
class MethodSpec:
    """A method name plus fixed parameters, e.g. ``dapq(keep_recent=32,content=random_vocab)``."""

    label: str
    name: str
    params: tuple[tuple[str, object], ...] = ()

    def build(self, budget: int | None):
        params = dict(self.params)
        if self.name == "full":
            return build(self.name, **params)
        return build(self.name, budget=budget, **params)


def parse_methods(spec: str) -> list[MethodSpec]:
    """Parse ``full,dapq,snapkv(window=16,kernel=5)`` into method specs (validated)."""
    parts, depth, cur = [], 0, ""
    for ch in spec:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    out = []
    for raw in (p.strip() for p in parts):
        if not raw:
            raise ConfigError(f"empty method in {spec!r}")
        m = re.fullmatch(r"([a-z_0-9]+)(?:\((.*)\))?", raw)
        if not m:
            raise ConfigError(f"cannot parse method {raw!r}; write name or name(key=value,...)")
        name, args = m.group(1), m.group(2)
        method_class(name)  # unknown names fail here
        params = []
        for item in filter(None, (a.strip() for a in (args or "").split(","))):
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"method parameter {item!r} needs key=value")
            try:
                parsed = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                parsed = value.strip()
            params.append((key.strip(), parsed))
        out.append(MethodSpec(label=raw, name=name, params=tuple(params)))
        out[-1].build(64)  # validate parameters now, not an hour into the sweep
    return out


def parse_budgets(text: str) -> list[int]:
    try:
        budgets = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise ConfigError(f"budgets must be integers, got {text!r}") from None
    if not budgets or any(b < 1 for b in budgets):
        raise ConfigError(f"budgets must be integers >= 1, got {text!r}")
    return budgets


def cells(methods: list[MethodSpec], budgets: list[int]) -> list[tuple[MethodSpec, int | None]]:
    """FullKV runs once (no budget); every other method once per budget."""
    out = []
    for spec in methods:
        if spec.name == "full":
            out.append((spec, None))
        else:
            out.extend((spec, b) for b in budgets)
    return out


def run_sweep(
    model,
    tokenizer,
    samples: list[Sample],
    methods: list[MethodSpec],
    budgets: list[int],
    store: ResultsStore,
    *,
    model_id: str,
    show_progress: bool = True,
    shared_prefill: bool = True,
    decode_batch: int = 8,
    executor: Executor | None = None,
    max_context: int | None = None,
) -> int:
    """Run every missing cell, appending each finished one to ``store``. Returns cells run.

    Prompts are tokenised once per sample, here; the model is loaded once by the caller (or by
    each worker of ``executor``). With ``shared_prefill`` (the default) each prompt is prefilled
    once and every pending (method, budget) cell of it compresses a copy of that cache and is
    decoded in batches of up to ``decode_batch`` cells (:func:`~dapq.generation.generate_many`):
    the same outputs as one prefill per cell, several times faster. Without it, each cell is its
    own prefill + compression + decode, whose timings are then per method.

    The pending cells become work units (:func:`work_units`) that ``executor`` runs: by default a
    :class:`~dapq.bench.executor.LocalExecutor` on ``model``; a
    :class:`~dapq.integrations.ray.RayExecutor` spreads them over Ray actors (``model`` may then
    be None, with the model's context length given as ``max_context``). Either way this process
    alone writes ``store``.
    """
    if model is not None:
        max_context = getattr(model.config, "max_position_embeddings", None)
    units = work_units(tokenizer, samples, methods, budgets, store, model_id=model_id, max_context=max_context,
                       shared_prefill=shared_prefill, decode_batch=decode_batch)
    if executor is None:
        executor = LocalExecutor(model, tokenizer)
    return write_results(executor, units, store, show_progress=show_progress)


def work_units(
    tokenizer,
    samples: list[Sample],
    methods: list[MethodSpec],
    budgets: list[int],
    store: ResultsStore,
    *,
    model_id: str,
    max_context: int | None = None,
    shared_prefill: bool = True,
    decode_batch: int = 8,
) -> list[WorkUnit]:
    """The cells of a sweep missing from ``store``, grouped into work units.

    A shared-prefill unit is every pending (method, budget) cell of one sample (one prefill,
    wherever it runs); with ``shared_prefill=False`` each cell is a unit of its own.
    """
    encoded = {}
    for s in samples:
        ids = encode_prompts(tokenizer, [s.prompt], chat=s.chat, answer_prefix=s.answer_prefix)[0]
        if max_context is not None and len(ids) + s.max_new_tokens + 64 > max_context:
            raise DapqError(f"{s.sample_id}: {len(ids)} prompt tokens exceed the model's context of {max_context}")
        encoded[s.sample_id] = tuple(ids)
    todo: list[tuple[Sample, Cell]] = []
    for spec, budget in cells(methods, budgets):
        method = spec.build(budget)
        for s in samples:
            key = cell_key(model=model_id, sample=s.sample_id, task=s.task, config=method.config(),
                           max_new_tokens=s.max_new_tokens, prompt=s.prompt, chat=s.chat)
            if key not in store:
                todo.append((s, Cell(key=key, spec=spec, budget=budget)))

    def unit(s: Sample, group: list[Cell]) -> WorkUnit:
        return WorkUnit(sample=s, prompt_ids=encoded[s.sample_id], cells=tuple(group), model_id=model_id,
                        shared_prefill=shared_prefill, decode_batch=decode_batch)

    if not shared_prefill:
        return [unit(s, [c]) for s, c in todo]
    by_sample: dict[str, tuple[Sample, list[Cell]]] = {}
    for s, c in todo:
        by_sample.setdefault(s.sample_id, (s, []))[1].append(c)
    return [unit(s, group) for s, group in by_sample.values()]
