"""The sweep runner: every (method, budget, sample) cell, resumable through the results store.

There is one runner for every executor: it computes the pending cells, groups them into work
units, and writes what the executor (local or Ray, :mod:`dapq.runs.executor`) hands back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigError, DapqError
from ..methods.spec import MethodSpec
from ..prompts import encode_context, encode_prompts, encode_question
from ..runs.executor import Executor, LocalExecutor, write_results
from .store import ResultsStore, cell_key
from .tasks import Sample
from .units import DEFAULT_PRECISION, Cell, WorkUnit

if TYPE_CHECKING:
    from ..models import ModelSpec

COMPRESS_MODES = ("prompt", "context")


def parse_budgets(text: str) -> list[int]:
    """``--budgets 64,128``: prompt tokens kept per KV head, integers >= 1."""
    try:
        budgets = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise ConfigError(f"budgets must be integers, got {text!r}") from None
    if not budgets or any(b < 1 for b in budgets):
        raise ConfigError(f"budgets must be integers >= 1, got {text!r}")
    return budgets


def parse_keep_fractions(text: str) -> list[float]:
    """``--keep-fractions 0.25,0.5``: fractions of each prompt (or context) kept, in (0, 1)."""
    try:
        fractions = [float(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise ConfigError(f"kept fractions must be numbers, got {text!r}") from None
    if not fractions or any(not 0.0 < r < 1.0 for r in fractions):
        raise ConfigError(f"kept fractions must lie in (0, 1) (kvpress's compression_ratio is 1 - this), "
                          f"got {text!r}")
    return fractions


def cells(methods: list[MethodSpec], budgets: list[int], keep_fractions: list[float] = ()
          ) -> list[tuple[MethodSpec, int | None, float | None]]:
    """FullKV runs once (no budget); every other method once per budget and once per kept fraction."""
    out = []
    for spec in methods:
        if not spec.evicts:
            out.append((spec, None, None))
        else:
            out.extend((spec, b, None) for b in budgets)
            out.extend((spec, None, r) for r in keep_fractions)
    return out


@dataclass(frozen=True)
class Sweep:
    """What a sweep runs: the samples and the (method, budget) cells, and how.

    Parameters
    ----------
    samples, methods, budgets, keep_fractions
        The cells: every method at every budget and kept fraction (FullKV once), on every sample.
    model_id : str
        The model's name in the records and keys.
    compress : {"prompt", "context"}
        Compress the whole prompt (the paper's setting), or each sample's context part only and
        feed its question uncompressed after it (:mod:`dapq.context`).
    shared_prefill : bool
        One FullKV prefill per prompt, compressed per method and decoded in batches of up to
        ``decode_batch`` cells (:func:`~dapq.generation.generate_many`), or one prefill per cell.
    model_spec : ModelSpec, optional
        What the kvpress child loads (kvpress peers need it).
    max_context : int, optional
        The model's context length, to refuse prompts that do not fit before anything runs.
    precision : (str, str)
        The dtype and device type the cells run in (``("bfloat16", "cuda")``; "auto" where Ray
        workers pick their device). Part of every key and record; a results directory made in
        another precision is refused.
    """

    samples: tuple[Sample, ...]
    methods: tuple[MethodSpec, ...]
    budgets: tuple[int, ...]
    model_id: str
    keep_fractions: tuple[float, ...] = ()
    compress: str = "prompt"
    shared_prefill: bool = True
    decode_batch: int = 8
    model_spec: ModelSpec | None = None
    max_context: int | None = None
    precision: tuple[str, str] = DEFAULT_PRECISION

    def __post_init__(self) -> None:
        if self.compress not in COMPRESS_MODES:
            raise ConfigError(f"--compress must be one of {', '.join(COMPRESS_MODES)}, got {self.compress!r}")


def run_sweep(model, tokenizer, samples: list[Sample], methods: list[MethodSpec], budgets: list[int],
              store: ResultsStore, *, executor: Executor | None = None, show_progress: bool = True,
              **options) -> int:
    """Run every missing cell, appending each finished one to ``store``. Returns cells run.

    ``options`` are :class:`Sweep`'s (``model_id`` is required). Prompts are tokenised once per
    sample, here; the model is loaded once by the caller (or by each worker of ``executor``).
    The pending cells become work units (:func:`work_units`) that ``executor`` runs: by default a
    :class:`~dapq.runs.executor.LocalExecutor` on ``model``; a
    :class:`~dapq.integrations.ray.RayExecutor` spreads them over Ray actors (``model`` may then be
    None, with the model's context length given as ``max_context``). Either way this process alone
    writes ``store``.
    """
    if model is not None:
        options["max_context"] = getattr(model.config, "max_position_embeddings", None)
        options["precision"] = (str(model.dtype).removeprefix("torch."), model.device.type)
    elif "precision" not in options:
        # A Ray executor's spec names the device its workers were given; a bare spec may leave it open.
        spec = getattr(executor, "spec", None) or options.get("model_spec")
        if spec is not None:
            options["precision"] = (spec.dtype, (spec.device or "auto").split(":")[0])
    sweep = Sweep(samples=tuple(samples), methods=tuple(methods), budgets=tuple(budgets),
                  **{k: tuple(v) if k == "keep_fractions" else v for k, v in options.items()})
    check_precision(store, sweep.precision)
    units = work_units(tokenizer, sweep, store)
    if executor is None:
        executor = LocalExecutor(model, tokenizer)
    return write_results(executor, units, store, show_progress=show_progress)


def check_precision(store: ResultsStore, precision: tuple[str, str]) -> None:
    """Refuse to add cells of one precision to a results directory made in another.

    Keys differ between precisions, so nothing would be reused by mistake, but one report would
    then average fp32 CPU rows with bf16 GPU rows under one name. Records older than the
    ``dtype``/``device`` fields were all made with the defaults then in force: float32 on the CPU.
    """
    made = {(r.get("dtype", DEFAULT_PRECISION[0]), r.get("device", DEFAULT_PRECISION[1]))
            for r in store if "taskset" in r}
    other = sorted(made - {tuple(precision)})
    if other:
        dtype, device = other[0]
        raise DapqError(f"{store.dir}: holds results made in {dtype} on {device}; this run is {precision[0]} on "
                        f"{precision[1]} (give the same --dtype/--device, or another --out)")


def encode_sample(tokenizer, s: Sample, compress: str) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """Token ids of a sample: ``(prompt, None)``, or ``(context, question)`` in context mode.

    The split is the task set's own (``Sample.context_end``), written once per task set; the
    chat template, when the task uses one, opens with the context and closes after the question.
    """
    if compress == "prompt":
        return tuple(encode_prompts(tokenizer, [s.prompt], chat=s.chat, answer_prefix=s.answer_prefix)[0]), None
    if s.context_end is None:
        raise DapqError(f"{s.taskset} task {s.task!r} has no question part: --compress context does not apply")
    context = encode_context(tokenizer, s.prompt[: s.context_end], chat=s.chat)
    question = encode_question(tokenizer, s.prompt[s.context_end :], chat=s.chat, answer_prefix=s.answer_prefix)
    return tuple(context), tuple(question)


def _encode_all(tokenizer, sweep: Sweep) -> dict[str, tuple]:
    """Every sample's token ids, by sample id, refusing repeated ids and prompts too long for the model."""
    encoded = {}
    for s in sweep.samples:
        if s.sample_id in encoded:  # units are grouped by id: two samples would share one unit's references
            raise DapqError(f"two samples share the id {s.sample_id!r} (NIAH ids round depths to 0.01; "
                            "a data file may repeat an id)")
        ids, question = encode_sample(tokenizer, s, sweep.compress)
        total = len(ids) + len(question or ())
        if sweep.max_context is not None and total + s.max_new_tokens + 64 > sweep.max_context:
            raise DapqError(f"{s.sample_id}: {total} prompt tokens exceed the model's context of {sweep.max_context}")
        encoded[s.sample_id] = ids, question
    return encoded


def _pending(sweep: Sweep, store: ResultsStore) -> list[tuple[Sample, Cell]]:
    """The cells whose record ``store`` lacks, under today's key or the key an older dapq gave it."""
    todo = []
    # Prompt-mode keys are those of earlier dapq versions, so their results files resume.
    mode = {} if sweep.compress == "prompt" else {"compress": sweep.compress}
    if sweep.precision != DEFAULT_PRECISION:  # keys made before precision was recorded stay valid
        mode.update(dtype=sweep.precision[0], device=sweep.precision[1])
    for spec, budget, fraction in cells(list(sweep.methods), list(sweep.budgets), list(sweep.keep_fractions)):
        configs = [spec.config(budget, fraction), spec.legacy_config(budget, fraction)]
        for s in sweep.samples:
            keys = [cell_key(model=sweep.model_id, sample=s.sample_id, task=s.task, config=config,
                             max_new_tokens=s.max_new_tokens, prompt=s.prompt, chat=s.chat, **mode)
                    for config in configs if config is not None]
            if not any(key in store for key in keys):
                todo.append((s, Cell(key=keys[0], spec=spec, budget=budget, keep_fraction=fraction)))
    return todo


def work_units(tokenizer, sweep: Sweep, store: ResultsStore) -> list:
    """The cells of a sweep missing from ``store``, grouped into work units.

    A shared-prefill unit is every pending dapq (method, budget) cell of one sample (one prefill,
    wherever it runs); with ``shared_prefill=False`` each cell is a unit of its own. The kvpress
    cells of a sample form a :class:`~dapq.integrations.kvpress_peer.PeerUnit`.
    """
    encoded = _encode_all(tokenizer, sweep)
    todo = _pending(sweep, store)
    if any(c.spec.peer for _, c in todo) and sweep.model_spec is None:
        raise ConfigError("kvpress methods need the model's spec (the command line passes it)")
    groups: dict[tuple, tuple[Sample, list[Cell]]] = {}
    for s, c in todo:
        if sweep.shared_prefill or c.spec.peer:
            groups.setdefault((s.sample_id, bool(c.spec.peer)), (s, []))[1].append(c)
        else:
            groups[(s.sample_id, c.key)] = (s, [c])
    return [_unit(sweep, s, group, *encoded[s.sample_id]) for s, group in groups.values()]


def _unit(sweep: Sweep, s: Sample, group: list[Cell], ids: tuple, question: tuple | None):
    if group[0].spec.peer:
        # Imported only when a sweep has kvpress cells: users without kvpress never load it.
        from ..integrations.kvpress_peer import PeerUnit

        return PeerUnit(sample=s, prompt_ids=ids, question_ids=question, cells=tuple(group), model_id=sweep.model_id,
                        model=sweep.model_spec.peer_fields(), compress=sweep.compress, precision=sweep.precision)
    return WorkUnit(sample=s, prompt_ids=ids, cells=tuple(group), model_id=sweep.model_id,
                    shared_prefill=sweep.shared_prefill, decode_batch=sweep.decode_batch, question_ids=question,
                    compress=sweep.compress, precision=sweep.precision)
