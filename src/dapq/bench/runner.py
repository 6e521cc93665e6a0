"""The sweep runner: every (method, budget, sample) cell, resumable through the results store."""

from __future__ import annotations

import ast
import json
import re
import time
from dataclasses import dataclass

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from ..errors import ConfigError, DapqError
from ..generation import encode_prompts, generate, generate_many
from ..methods import build, method_class
from .metrics import score
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
) -> int:
    """Run every missing cell, appending each finished one to ``store``. Returns cells run.

    Prompts are tokenised once per sample; the model is loaded once by the caller. With
    ``shared_prefill`` (the default) each prompt is prefilled once and every pending (method,
    budget) cell of it compresses a copy of that cache and is decoded in batches of up to
    ``decode_batch`` cells (:func:`~dapq.generation.generate_many`): the same outputs as one
    prefill per cell, several times faster. Without it, each cell is its own prefill +
    compression + decode, whose timings are then per method.
    """
    limit = getattr(model.config, "max_position_embeddings", None)
    encoded = {}
    for s in samples:
        ids = encode_prompts(tokenizer, [s.prompt], chat=s.chat, answer_prefix=s.answer_prefix)[0]
        if limit is not None and len(ids) + s.max_new_tokens + 64 > limit:
            raise DapqError(f"{s.sample_id}: {len(ids)} prompt tokens exceed the model's context of {limit}")
        encoded[s.sample_id] = ids
    todo = []
    for spec, budget in cells(methods, budgets):
        method = spec.build(budget)
        for s in samples:
            key = cell_key(model=model_id, sample=s.sample_id, task=s.task, config=method.config(),
                           max_new_tokens=s.max_new_tokens, prompt=s.prompt, chat=s.chat)
            if key not in store:
                todo.append((spec, budget, method, s, key))
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("eta"), TimeRemainingColumn(), disable=not show_progress, transient=False,
    )

    def save(cell, result, wall_s: float, shared: bool) -> None:
        spec, budget, method, s, key = cell
        text = result.text.lstrip("\n").split("\n")[0] if s.meta.get("first_line") else result.text
        store.append({
            "key": key, "model": model_id, "taskset": s.taskset, "task": s.task, "sample_id": s.sample_id,
            "label": spec.label, "method": spec.name, "budget": budget, "config": method.config(),
            "prediction": result.text, "references": list(s.references), "metric": s.metric,
            "score": score(s.metric, text, s.references, **s.metric_args), "prompt_tokens": result.prompt_tokens,
            "prefill_s": result.prefill_s, "compress_s": result.compress_s,
            "decode_tokens_per_s": result.decode_tokens_per_s, "kv_bytes_full": result.kv_bytes_full,
            "kv_bytes_kept": result.kv_bytes_kept, "wall_s": wall_s, "shared_prefill": shared,
            "meta": json.loads(json.dumps(s.meta)),
        })
        progress.advance(bar)

    with progress:
        bar = progress.add_task("sweep", total=len(todo))
        if shared_prefill:
            by_sample: dict[str, list] = {}
            for cell in todo:
                by_sample.setdefault(cell[3].sample_id, []).append(cell)
            for group in by_sample.values():
                s = group[0][3]
                progress.update(bar, description=f"{s.task} {s.sample_id}: {len(group)} cells, one prefill")
                start = time.perf_counter()
                results = generate_many(model, tokenizer, encoded[s.sample_id], [c[2] for c in group],
                                        max_new_tokens=s.max_new_tokens, stop=s.stop, max_batch=decode_batch)
                wall = (time.perf_counter() - start) / len(group)
                for cell, result in zip(group, results, strict=True):
                    save(cell, result, wall, True)
        else:
            for cell in todo:
                spec, budget, method, s, _ = cell
                progress.update(bar, description=f"{spec.label} budget={budget or 'all'} {s.task}")
                start = time.perf_counter()
                result = generate(model, tokenizer, [s.prompt], method, prompt_ids=[encoded[s.sample_id]],
                                  max_new_tokens=s.max_new_tokens, stop=s.stop)[0]
                save(cell, result, time.perf_counter() - start, False)
    return len(todo)
