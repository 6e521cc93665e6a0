"""``dapq bench speed``: what each method costs at prefill and buys at decode.

The shape of the paper's Tables 3, 4 and 7 (see ``shared/notes/paper.md``), as four kinds of cell
written to the same resumable :class:`~dapq.bench.store.ResultsStore` as the accuracy sweeps:

``ttft``
    Prefill + compression wall time of one prompt against context length, with the compression
    step (the eviction hooks) and the forward pass reported separately.
``decode``
    Decode tokens/s, peak memory and KV bytes held against batch size, at one context length and
    budget. The batch-``B`` state is the batch-1 state repeated ``B`` times
    (:meth:`~dapq.compress.PrefillResult.repeat`): decode cost depends on the cache's shape, not
    on its values, and it spares ``B`` prefills per cell. Peak memory is therefore the decode
    phase's (cache + activations), not the prefill's.
``e2e``
    One prompt end to end at batch 1 (prefill + compress + ``T`` new tokens), the figure the
    kvpress peer row (:mod:`dapq.integrations.kvpress_peer`) is compared with.
``peer``
    The same prompt through kvpress's own pipeline, timed in a child process (kvpress patches
    transformers' attention functions at import, which must not leak into dapq's timings).

Every cell does ``warmup`` untimed runs, then ``repeats`` timed ones; records keep every sample,
the median and the spread. The TTFT and e2e cells of all methods at one length are timed in turns
(:func:`measure_round_robin`: A, B, C, then B, C, A, ...), so the machine's drift hits every method
alike. Ratios to ``full`` are taken at report time between cells of the same session (one
invocation), so they are always side by side on the same machine state. Running out
of memory is a result, not a crash: the cell records ``oom`` and larger batches of that method
are skipped. On the CPU the cell is not even tried when its estimate exceeds the free memory,
because the Linux OOM killer would end the whole run instead of raising.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

from .. import compat
from ..compress import make_batch, prefill
from ..decoding import DecodeStepper, resolve_decode
from ..errors import first_line
from ..methods.spec import MethodSpec
from ..models import placeholder_tokenizer
from ..state import PrefillResult
from ..timing import Timing
from .store import ResultsStore, cell_key
from .tasks import haystack_text

Clock = Callable[[], float]


@dataclass(frozen=True)
class SpeedConfig:
    """What ``dapq bench speed`` measures (defaults: the embedded model on this machine).

    Parameters
    ----------
    context : int
        Prompt length of the decode and e2e cells.
    budget : int
        KV budget of every compressing method.
    lengths : tuple of int
        Prompt lengths of the TTFT cells.
    batches : tuple of int
        Batch sizes of the decode cells, tried in order until one runs out of memory.
    decode_tokens : int
        New tokens per decode / e2e run (T).
    repeats, warmup : int
        Timed and untimed runs per cell.
    parts : tuple of str
        Which kinds of cell to run: ``ttft``, ``decode``, ``e2e``, ``peer``.
    memory_limit : int, optional
        Bytes a decode cell may use before it is reported as OOM unrun (default: 90% of the
        memory available when the cell starts, on the CPU or the GPU). Such a prediction is not a
        result: a re-run tries the cell again.
    decode : str
        How decode cells store new keys and values (:data:`dapq.decoding.DECODE_MODES`).
    """

    context: int = 4000
    budget: int = 128
    lengths: tuple[int, ...] = (1000, 2000, 4000, 8000)
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    decode_tokens: int = 32
    repeats: int = 3
    warmup: int = 1
    parts: tuple[str, ...] = ("ttft", "decode", "e2e", "peer")
    memory_limit: int | None = None
    decode: str = "auto"

    def needed_lengths(self) -> tuple[int, ...]:
        """Prompt lengths of the cells this configuration makes: the TTFT lengths, the context of the rest."""
        lengths = self.lengths if "ttft" in self.parts else ()
        return lengths + ((self.context,) if set(self.parts) - {"ttft"} else ())


#: ``--quick``: every kind of cell at tiny sizes, for CI smoke tests (well under 2 minutes here).
QUICK = SpeedConfig(context=256, budget=32, lengths=(128, 256), batches=(1, 2, 4), decode_tokens=4,
                    repeats=2, warmup=1)
PARTS = ("ttft", "decode", "e2e", "peer")


# ---------------------------------------------------------------------------- measuring
def measure_round_robin(fns: dict[str, Callable[[], object]], *, repeats: int, warmup: int,
                        clock: Clock = time.perf_counter, sync: Callable[[], None] = lambda: None,
                        ) -> dict[str, tuple[Timing, list] | BaseException]:
    """Warm every function up, then time them in turns: round ``r`` calls each one once.

    The order is rotated by one each round. A noisy machine drifts (frequency, other tenants,
    memory state); timing all repeats of A and then all of B turns that drift into a difference
    between A and B, while turns spread it over both, which is what makes the ratios between
    them meaningful. Returns, per function, the wall times and what each timed call returned,
    or the exception if it ran out of memory (it then leaves the rotation). ``sync`` runs before
    reading the clock (``torch.cuda.synchronize`` on a GPU, where kernels run asynchronously).
    """
    out: dict[str, tuple[Timing, list] | BaseException] = {}

    def call(label: str):
        try:
            return fns[label]()
        except Exception as exc:  # only memory errors are results; anything else is a bug
            if not is_oom(exc):
                raise
            out[label] = exc
            return exc

    live = list(fns)
    for label in fns:
        for _ in range(warmup):
            if isinstance(call(label), BaseException):
                break
    timed = {label: (Timing(), []) for label in live if label not in out}
    for r in range(repeats):
        turn = [label for label in live[r % len(live):] + live[: r % len(live)] if label not in out]
        for label in turn:
            sync()
            start = clock()
            result = call(label)
            sync()
            if not isinstance(result, BaseException):
                timed[label][0].samples.append(clock() - start)
                timed[label][1].append(result)
    return {label: out.get(label, timed.get(label)) for label in fns}


def measure(fn: Callable[[], object], *, repeats: int, warmup: int, clock: Clock = time.perf_counter,
            sync: Callable[[], None] = lambda: None) -> tuple[Timing, list]:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times timed (raises on OOM)."""
    result = measure_round_robin({"fn": fn}, repeats=repeats, warmup=warmup, clock=clock, sync=sync)["fn"]
    if isinstance(result, BaseException):
        raise result
    return result


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """Peak memory inside a ``with`` block: CUDA allocator peak, or process RSS on the CPU.

    On the CPU a daemon thread samples the resident set every ``interval`` seconds (there is no
    resettable peak counter for RSS); ``peak`` is the largest sample, ``baseline`` the value on
    entry, both in bytes.
    """

    def __init__(self, device: torch.device | str, interval: float = 0.005, read: Callable[[], int] = _rss_bytes):
        self.device = torch.device(device)
        self.interval = interval
        self.read = read
        self.baseline = self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = self.peak = torch.cuda.memory_allocated(self.device)
            return self
        self.baseline = self.peak = self.read()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.read())

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = max(self.peak, torch.cuda.max_memory_allocated(self.device))
            return
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.read())


def is_oom(exc: BaseException) -> bool:
    """True for the ways running out of memory surfaces in torch."""
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in str(exc).lower()


def available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo``, or None where there is no such file."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _sync_fn(device: torch.device) -> Callable[[], None]:
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------- cells
def _oom_record(exc: BaseException) -> dict:
    return {"oom": True, "error": first_line(exc, type(exc).__name__)[:200]}


def ttft_cells(model, methods: dict[str, object], ids: Sequence[int], cfg: SpeedConfig, *, tokenizer=None,
               clock: Clock = time.perf_counter) -> dict[str, dict]:
    """Prefill + compression of one prompt for several methods, timed in turns.

    Per method: wall time, its forward and compression parts, and the peak memory of its runs.
    """
    device = model.device

    def runner(method):
        def run():
            with PeakMemory(device) as mem:
                stats = prefill(model, method, make_batch(model, method, [list(ids)], pad_id=0,
                                                          tokenizer=tokenizer)).stats
            return stats.prefill_s, stats.compress_s, mem.peak, mem.peak - mem.baseline
        return run

    results = measure_round_robin({label: runner(m) for label, m in methods.items()}, repeats=cfg.repeats,
                                  warmup=cfg.warmup, clock=clock, sync=_sync_fn(device))
    out = {}
    for label, result in results.items():
        if isinstance(result, BaseException):
            out[label] = _oom_record(result)
            continue
        timing, parts = result
        out[label] = {
            "ttft_s": timing.to_dict(),
            "forward_s": Timing([p[0] for p in parts]).to_dict(),
            "compress_s": Timing([p[1] for p in parts]).to_dict(),
            "peak_bytes": max(p[2] for p in parts),
            "peak_delta_bytes": max(p[3] for p in parts),
        }
    return out


def decode_estimate(single: PrefillResult, batch: int, steps: int, model) -> int:
    """Bytes a decode cell at ``batch`` needs beyond the batch-1 state: cache + growth + logits."""
    cache = single.cache
    kv = cache.kv_bytes()
    per_token = sum(layer.keys[:, :, :1].nbytes * 2 for layer in cache.layers)
    logits = model.config.vocab_size * 4 * 3  # fp32 logits, argmax and sampling temporaries
    return batch * (kv + per_token * (steps + 1) + logits) + 64 * 2**20


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second (read + written) of a large tensor copy on ``device``: the memory ceiling."""
    src = torch.rand(256 * 2**20 if device.type == "cuda" else 64 * 2**20, device=device)
    dst = torch.empty_like(src)
    sync = _sync_fn(device)
    times = []
    for _ in range(5):
        sync()
        start = time.perf_counter()
        dst.copy_(src)
        sync()
        times.append(time.perf_counter() - start)
    del src, dst
    return 2 * 4 * (256 * 2**20 if device.type == "cuda" else 64 * 2**20) / sorted(times)[2]


def decode_cell(model, single: PrefillResult, batch: int, cfg: SpeedConfig, *,
                clock: Clock = time.perf_counter, bandwidth: float | None = None) -> dict:
    """Greedy decoding of ``cfg.decode_tokens`` tokens for ``batch`` copies of a prefilled prompt.

    With ``bandwidth`` (bytes/s), the record also holds the memory-bandwidth bound: a step reads
    every weight and every cached key and value once, so no decode beats
    ``batch * bandwidth / (weight bytes + KV bytes)`` tokens per second.
    """
    device = model.device
    state = single.repeat(batch) if batch > 1 else single
    widths = [layer.keys.shape[2] for layer in state.cache.layers]
    first = state.logits.argmax(dim=-1)
    steps = cfg.decode_tokens
    kv_held = state.cache.kv_bytes()

    def run():
        for layer, width in zip(state.cache.layers, widths, strict=True):
            compat.truncate(layer, width)  # forget the previous repeat's tokens: every repeat decodes the same steps
        token = first
        with DecodeStepper(model, state, steps, decode=cfg.decode) as step:
            for _ in range(steps):
                token = step(token).argmax(dim=-1)
        return None

    with PeakMemory(device) as mem:
        timing, _ = measure(run, repeats=cfg.repeats, warmup=cfg.warmup, clock=clock, sync=_sync_fn(device))
    for layer, width in zip(state.cache.layers, widths, strict=True):
        compat.truncate(layer, width)
    weights = sum(p.nbytes for p in model.parameters())
    bound = None if bandwidth is None else batch * bandwidth / (weights + kv_held)
    return {
        "decode_s": timing.to_dict(),
        "tokens_per_s": batch * steps / timing.median,
        "weight_bytes": weights, "bandwidth_bytes_per_s": bandwidth, "bound_tokens_per_s": bound,
        "kv_bytes_kept": kv_held,
        "kv_bytes_full": state.stats.kv_bytes_full,
        "kept_per_layer": state.cache.kept_per_layer(),
        "peak_bytes": mem.peak,
        "peak_delta_bytes": mem.peak - mem.baseline,
    }


def e2e_cells(model, methods: dict[str, object], ids: Sequence[int], cfg: SpeedConfig, *, tokenizer=None,
              clock: Clock = time.perf_counter) -> dict[str, dict]:
    """One prompt end to end at batch 1 (prefill + compress, then ``T - 1`` decode steps), in turns.

    The first new token comes from the prefill's logits, as in kvpress's pipeline, whose
    question forward plays that part (:mod:`dapq.integrations.kvpress_peer`).
    """
    device = model.device
    steps = cfg.decode_tokens

    def runner(method):
        def run():
            state = prefill(model, method, make_batch(model, method, [list(ids)], pad_id=0, tokenizer=tokenizer))
            token = state.logits.argmax(dim=-1)
            with DecodeStepper(model, state, steps, decode=cfg.decode) as step:
                for _ in range(steps - 1):
                    token = step(token).argmax(dim=-1)
        return run

    results = measure_round_robin({label: runner(m) for label, m in methods.items()}, repeats=cfg.repeats,
                                  warmup=cfg.warmup, clock=clock, sync=_sync_fn(device))
    return {label: _oom_record(r) if isinstance(r, BaseException) else {"e2e_s": r[0].to_dict()}
            for label, r in results.items()}


# ---------------------------------------------------------------------------- prompts
def prompt_ids(tokenizer, length: int, *, vocab_size: int, seed: int = 0) -> list[int]:
    """``length`` prompt tokens: the shipped essays haystack, or seeded random ids without a tokenizer."""
    if tokenizer is None:
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(0, vocab_size, (length,), generator=gen).tolist()
    ids = tokenizer(haystack_text("essays"), add_special_tokens=False)["input_ids"]
    while len(ids) < length:
        ids = ids + ids
    return ids[:length]


# ---------------------------------------------------------------------------- the sweep
@dataclass
class SpeedRun:
    """One invocation of the speed benchmark: model, methods, config, and where results go."""

    model: object
    tokenizer: object
    specs: list[MethodSpec]
    store: ResultsStore
    cfg: SpeedConfig
    model_id: str
    peer: Callable[..., list[dict]] | None = None
    """``peer(ids, cfg) -> records`` (see :func:`dapq.integrations.kvpress_peer.run_kvpress`); None skips."""
    session: str = field(default_factory=lambda: time.strftime("%Y%m%dT%H%M%S"))
    clock: Clock = time.perf_counter
    echo: Callable[[str], None] = print

    def _base(self, cell: str, spec: MethodSpec | None, **fields) -> dict:
        model = self.model
        if cell in ("decode", "e2e"):
            # How the decode stores the cache changes its speed: part of what a record measured.
            fields["decode"] = resolve_decode(self.cfg.decode)
        return {
            "analysis": "speed", "taskset": "speed", "cell": cell, "model": self.model_id,
            "device": str(model.device), "dtype": str(model.dtype).replace("torch.", ""),
            "attn": model.config._attn_implementation, "threads": torch.get_num_threads(),
            "label": spec.label if spec else None, "method": spec.name if spec else None,
            "budget": None if spec is None or not spec.evicts else self.cfg.budget, **fields,
        }

    def _key(self, base: dict) -> str:
        cfg = self.cfg
        return cell_key(**{k: v for k, v in base.items() if k != "threads"}, repeats=cfg.repeats,
                        warmup=cfg.warmup, decode_tokens=cfg.decode_tokens)

    def _save(self, base: dict, result: dict) -> dict:
        record = {"key": self._key(base), "session": self.session, **base, **result}
        self.store.append(record)
        return record

    @cached_property
    def bandwidth(self) -> float:
        """This device's copy bandwidth, measured once per run (the decode cells' bound)."""
        return copy_bandwidth(self.model.device)

    @cached_property
    def text_tokenizer(self):
        """What turns a text pseudo context (DapQ's ``fixed`` content) into ids; a placeholder
        for random-weight models, whose speed does not depend on which ids they are. Built once
        per run, not once per cell."""
        return self.tokenizer if self.tokenizer is not None else placeholder_tokenizer()

    def _ids(self, length: int) -> list[int]:
        return prompt_ids(self.tokenizer, length, vocab_size=self.model.config.vocab_size)

    def _guarded(self, base: dict, fn: Callable[[], dict]) -> dict:
        """Run a cell, turning out-of-memory into an ``oom`` record."""
        try:
            result = fn()
        except Exception as exc:  # only memory errors are results; anything else is a bug
            if not is_oom(exc):
                raise
            _release(self.model.device)
            result = _oom_record(exc)
        return self._save(base, result)

    def _limit(self) -> int | None:
        if self.cfg.memory_limit is not None:
            return self.cfg.memory_limit
        device = self.model.device
        if device.type == "cuda":
            # Trying a cell far past the free memory costs GPU time just to reach the OOM.
            return int(0.9 * torch.cuda.mem_get_info(device)[0])
        if device.type != "cpu":
            return None
        free = available_bytes()
        return None if free is None else int(0.9 * free)

    def _turns(self, cell: str, cells_fn, ids: list[int], **fields) -> None:
        """Run the pending cells of every method for one prompt in turns, and save each."""
        todo = {}
        for spec in self.specs:
            base = self._base(cell, spec, **fields)
            if self._key(base) not in self.store:
                todo[spec.label] = (spec, base)
        if not todo:
            return
        self.echo(f"{cell} {', '.join(todo)} {fields}")
        methods = {label: spec.build(self.cfg.budget) for label, (spec, _) in todo.items()}
        try:
            results = cells_fn(self.model, methods, ids, self.cfg, tokenizer=self.text_tokenizer, clock=self.clock)
        finally:
            _release(self.model.device)
        for label, (_, base) in todo.items():
            self._save(base, results[label])

    def run_ttft(self) -> None:
        for length in self.cfg.lengths:
            self._turns("ttft", ttft_cells, self._ids(length), context=length, batch=1)

    def run_decode(self) -> None:
        ids = self._ids(self.cfg.context)
        for spec in self.specs:
            todo = []
            for batch in self.cfg.batches:
                base = self._base("decode", spec, context=self.cfg.context, batch=batch)
                done = self.store.get(self._key(base))
                if done is not None and done.get("oom") and not done.get("predicted"):
                    break  # this method already ran out of memory at a smaller batch
                if done is None or done.get("predicted"):  # a prediction is not a result: try again
                    todo.append((batch, base))
            if not todo:
                continue
            method = spec.build(self.cfg.budget)
            single = prefill(self.model, method, make_batch(self.model, method, [ids], pad_id=0,
                                                            tokenizer=self.text_tokenizer))
            for batch, base in todo:
                limit = self._limit()
                need = decode_estimate(single, batch, self.cfg.decode_tokens, self.model)
                self.echo(f"decode {spec.label} batch={batch}")
                if limit is not None and need > limit:
                    self._save(base, {"oom": True, "predicted": True, "need_bytes": need, "limit_bytes": limit})
                    break
                record = self._guarded(base, lambda b=batch, s=single: decode_cell(
                    self.model, s, b, self.cfg, clock=self.clock, bandwidth=self.bandwidth))
                if record.get("oom"):
                    break
            del single
            _release(self.model.device)

    def run_e2e(self) -> None:
        self._turns("e2e", e2e_cells, self._ids(self.cfg.context), context=self.cfg.context, batch=1)

    def run_peer(self) -> None:
        if self.peer is None:
            return
        base = self._base("peer", None, context=self.cfg.context, batch=1, budget=self.cfg.budget)
        if self._key(base) in self.store:
            return
        self.echo("kvpress peer rows")
        records = self.peer(self._ids(self.cfg.context), self.cfg)
        for rec in records:
            self.store.append({"key": cell_key(parent=self._key(base), press=rec.get("label")),
                               "session": self.session, **base, **rec})
        # The marker record: the peer cells of this configuration are done.
        self._save(base, {"label": None, "done": True, "rows": len(records)})

    def run(self) -> None:
        """Run the configured parts in order: cheap and decisive first (TTFT), the peer last."""
        for part in self.cfg.parts:
            getattr(self, f"run_{part}")()
