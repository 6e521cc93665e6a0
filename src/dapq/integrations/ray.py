"""Scale-out on Ray: sweeps and bulk generation over N actors, and a Ray Data entry point.

:class:`RayExecutor` runs the work units of :mod:`dapq.runs.executor` on N Ray actors. Each
actor loads the model once, from a picklable :class:`~dapq.models.ModelSpec` (the weights are
never shipped), and runs one unit at a time with ``unit.run(model, tokenizer)``: what the local
executor calls, so a cell's prediction and score do not depend on where it ran.
Units carry method configs, token ids and sample data. The driver keeps every actor busy,
collects finished units with ``ray.wait`` as they come, and stays the only writer of the results
file.

Faults: when an actor dies (its process killed, ``ray.kill``, a node lost), the unit it was
running is handed to another actor and a replacement actor is started. Cells finished before
the death were written already; the writer drops records it has, so nothing is recorded twice.
A unit that kills ``max_unit_attempts`` workers, or more than ``max_restarts`` deaths in one
executor's life, stops the run with one error line.

:class:`GenerateBatch` is for Ray Data users::

    import ray
    from dapq.integrations.ray import GenerateBatch

    ds = ray.data.read_json("prompts.jsonl")             # rows with a "prompt" column
    out = ds.map_batches(GenerateBatch, fn_constructor_kwargs={"method": "dapq", "budget": 128},
                         compute=ray.data.ActorPoolStrategy(size=2), batch_size=4)

This module imports ``ray`` (``pip install dapq[ray]``); ``dapq`` imports it only for ``--ray``.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence

import ray
import ray.exceptions

from ..bulk import MethodDefaults, Request, encode_requests, method_of_record, result_fields
from ..errors import ConfigError, DapqError, first_line
from ..generation import SamplingConfig, generate
from ..models import ModelSpec
from ..runs.executor import Unit


def connect(address: str | None = None, *, num_cpus: int | None = None) -> bool:
    """Join the Ray cluster at ``address``, or start a local Ray; True when this call started it.

    A Ray already initialised in this process (a notebook, a test fixture) is used as it is.
    """
    if ray.is_initialized():
        return False
    if address:
        check_reachable(address)
        # A port that answers but is no Ray head (a proxy, another service) passes the probe; then
        # bound Ray's own retries, which default to minutes, and keep its retry warnings quiet.
        # A user's own settings of these variables win.
        for name in ("RAY_py_gcs_connect_timeout_s", "RAY_gcs_rpc_server_reconnect_timeout_s"):
            os.environ.setdefault(name, str(max(1, round(CONNECT_TIMEOUT_S))))
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
    try:
        if address:
            ray.init(address=address, include_dashboard=False, logging_level="warning")
        else:
            ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, logging_level="warning")
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        raise DapqError(f"cannot start or join {where}: {first_line(exc)}") from None
    return True


#: Seconds to wait for a Ray head to answer before giving up (Ray itself retries for minutes).
CONNECT_TIMEOUT_S = float(os.environ.get("DAPQ_RAY_CONNECT_TIMEOUT", "15"))


def check_reachable(address: str, timeout: float | None = None) -> None:
    """Refuse, within ``timeout`` seconds, a Ray address whose host does not answer on its port.

    ``ray.init`` retries an unreachable head for about ten minutes, printing only its own
    warnings; one TCP connection to the head's port tells the same in seconds. ``auto`` and
    ``local`` name no host and are left to Ray.
    """
    timeout = CONNECT_TIMEOUT_S if timeout is None else timeout
    target = address.removeprefix("ray://")
    if target in ("auto", "local"):
        return
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise DapqError(f"--ray={address}: write the head's address as HOST:PORT (or ray://HOST:PORT)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        reason = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise DapqError(f"cannot reach the Ray cluster at {address} within {timeout:g} s ({reason}); "
                        "is its head running (ray start --head)?") from None


class _Worker:
    """One Ray actor: loads the model once, then runs work units one at a time."""

    def __init__(self, spec: ModelSpec, threads: int):
        import torch
        from transformers.utils import logging as hf_logging

        torch.set_num_threads(threads)  # the actor's CPU share, not the whole node's cores
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        self.model, self.tokenizer = spec.load()

    def ready(self) -> int:
        return os.getpid()

    def run(self, unit) -> list[dict]:
        return unit.run(self.model, self.tokenizer)


def _telling_line(exc: BaseException) -> str:
    """The most telling line of a Ray error: the last line that names an error (Ray prints the
    cause's own message last, after its traceback), else the last line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error:" in ln or "Exception:" in ln:
            return ln
    return lines[-1] if lines else type(exc).__name__


class RayExecutor:
    """Run work units on N Ray actors, one model per actor.

    Parameters
    ----------
    model : ModelSpec
        What each actor loads. ``device=None`` means CUDA for GPU workers, else CPU.
    workers : int
        Actors to start (lazily, when the first units arrive; never more than there are units).
    gpus_per_worker : float, optional
        GPUs per actor; default 1 where the cluster has GPUs and the spec's device is not CPU, else 0.
    cpus_per_worker : float, optional
        CPUs per actor (also its torch thread count); default the node's CPUs split evenly.
    address : str, optional
        A running cluster to join (``auto``, ``host:6379``, ``ray://host:10001``); default a local Ray.
    max_unit_attempts : int
        A unit running when this many workers died is not tried again: the run stops.
    max_restarts : int, optional
        Replacement actors over the executor's life (default ``2 * workers + 2``).
    echo : callable, optional
        Receives one line per lost worker (default: stderr).
    """

    def __init__(self, model: ModelSpec, *, workers: int = 1, gpus_per_worker: float | None = None,
                 cpus_per_worker: float | None = None, address: str | None = None, max_unit_attempts: int = 3,
                 max_restarts: int | None = None, echo: Callable[[str], None] | None = None):
        if workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {workers}")
        if (gpus_per_worker is not None and gpus_per_worker < 0) or (cpus_per_worker is not None and cpus_per_worker <= 0):
            raise ConfigError("--gpus-per-worker must be >= 0 and CPUs per worker > 0")
        self.workers = workers
        self.max_unit_attempts = max_unit_attempts
        self.max_restarts = 2 * workers + 2 if max_restarts is None else max_restarts
        self.echo = echo or (lambda msg: print(f"dapq: {msg}", file=sys.stderr))
        self._started_ray = connect(address)
        try:
            self.gpus, self.cpus = self._plan(model, gpus_per_worker, cpus_per_worker)
        except BaseException:
            self.close()
            raise
        device = model.device or ("cuda" if self.gpus > 0 else "cpu")
        self.spec = model.on(device)
        self.threads = max(1, int(self.cpus))
        self._actors: list = []
        self._starting: dict = {}  # ObjectRef of ready() -> actor, for actors still loading the model
        self.patience = 60.0  # seconds without news before saying that workers wait for resources
        self.deaths = 0  # workers lost over this executor's life (the fault tests read it)

    # ----------------------------------------------------------------- resources
    def _plan(self, model: ModelSpec, gpus: float | None, cpus: float | None) -> tuple[float, float]:
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        if gpus is None:
            wants_gpu = model.device is None or str(model.device).startswith("cuda")
            gpus = 1.0 if wants_gpu and any(n.get("GPU", 0) >= 1 for n in nodes) else 0.0
        hosts = [n for n in nodes if n.get("GPU", 0) >= gpus] if gpus else nodes
        if not hosts:
            raise DapqError(f"no node of the Ray cluster has {gpus:g} GPU(s) for one worker")
        if cpus is None:
            if gpus:  # share each GPU node's CPUs among the workers its GPUs can hold
                cpus = min(n.get("CPU", 1) / max(1, math.floor(n["GPU"] / gpus)) for n in hosts)
            else:
                cpus = min(sum(n.get("CPU", 0) for n in hosts) / self.workers, max(n.get("CPU", 0) for n in hosts))
            cpus = max(1.0, math.floor(cpus))
        fit = sum(min(math.floor(n.get("CPU", 0) / cpus), math.floor(n.get("GPU", 0) / gpus) if gpus else 10**9)
                  for n in hosts)
        if fit < 1:
            raise DapqError(f"no node of the Ray cluster can hold one worker ({cpus:g} CPUs, {gpus:g} GPUs)")
        if fit < self.workers:
            self.echo(f"the cluster holds {fit} of the {self.workers} workers asked for now; "
                      "the others start if it grows")
        return float(gpus), float(cpus)

    def _start(self) -> None:
        cls = ray.remote(_Worker).options(num_cpus=self.cpus, num_gpus=self.gpus, max_restarts=0,
                                          max_task_retries=0)
        actor = cls.remote(self.spec, self.threads)
        self._actors.append(actor)
        # Units go to an actor only once it has loaded the model: an actor the cluster cannot
        # place yet never holds work that the others could do.
        self._starting[actor.ready.remote()] = actor

    def _drop(self, actor) -> None:
        if actor in self._actors:
            self._actors.remove(actor)
        for ref in [r for r, a in self._starting.items() if a == actor]:
            del self._starting[ref]
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already gone
            pass

    def start(self) -> None:
        """Start every worker now and wait until each has loaded the model (``run`` does it lazily)."""
        for _ in range(self.workers - len(self._actors)):
            self._start()
        pending, warned = list(self._starting), False
        while pending:
            # A cluster without room for an actor never places it: say so instead of waiting silently.
            ready, pending = ray.wait(pending, num_returns=1, timeout=self.patience)
            if not ready:
                if not warned:
                    warned = True
                    self.echo(f"waiting for the cluster to place a worker ({self.cpus:g} CPUs, {self.gpus:g} "
                              f"GPUs each; free now: {ray.available_resources()})")
                continue
            try:
                ray.get(ready[0])
            except ray.exceptions.RayActorError as exc:
                raise DapqError(f"a Ray worker could not start: {_telling_line(exc)}") from None
            self._starting.pop(ready[0], None)

    # ----------------------------------------------------------------- running
    def run(self, units: Sequence[Unit], on_start: Callable[[Unit], None] | None = None
            ) -> Iterator[tuple[Unit, list[dict]]]:
        """Yield ``(unit, records)`` as units finish on the actors (completion order)."""
        units = list(units)
        if not units:
            return
        queue = deque(range(len(units)))
        attempts = [0] * len(units)
        for _ in range(min(self.workers, len(units)) - len(self._actors)):
            self._start()
        idle = deque(a for a in self._actors if a not in self._starting.values())
        running: dict = {}  # ObjectRef of a unit -> (actor, unit index)
        warned = False

        def feed() -> None:
            while idle and queue:
                actor, idx = idle.popleft(), queue.popleft()
                if on_start is not None:
                    on_start(units[idx])
                running[actor.run.remote(units[idx])] = (actor, idx)

        finished = False
        try:
            while queue or running:
                feed()
                waiting = list(running) + list(self._starting)
                if not waiting:
                    raise DapqError("no Ray worker left to run the remaining units")
                ready, _ = ray.wait(waiting, num_returns=1, timeout=self.patience)
                if not ready:
                    if not running and not warned:
                        warned = True
                        self.echo(f"waiting for the cluster to place a worker ({self.cpus:g} CPUs, {self.gpus:g} "
                                  f"GPUs each; free now: {ray.available_resources()})")
                    continue
                ref = ready[0]
                if ref in self._starting:
                    actor, idx = self._starting.pop(ref), None
                else:
                    actor, idx = running.pop(ref)
                try:
                    records = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    self._recover(exc, actor, idx, units, attempts, queue)
                    continue
                except ray.exceptions.RayTaskError as exc:
                    if isinstance(exc.cause, DapqError):  # bad input found by a worker: one line
                        raise DapqError(str(exc.cause)) from None
                    raise
                idle.append(actor)
                if idx is not None:
                    feed()  # keep the workers busy while the driver writes
                    yield units[idx], records
            finished = True
        finally:
            if not finished:
                # Interrupted or failed: stop the work in flight (its results would be stale to
                # the next run of this executor). Finished units were written already.
                for actor in list(self._actors):
                    self._drop(actor)

    def _recover(self, exc, actor, idx: int | None, units: list, attempts: list[int], queue: deque) -> None:
        """A worker died: queue its unit again on a replacement, or give up with one line."""
        if getattr(exc, "actor_init_failed", False):  # loading the model failed: so would a retry
            raise DapqError(f"a Ray worker could not load the model: {_telling_line(exc)}") from None
        self._lost(actor, exc, None if idx is None else units[idx])
        if idx is not None:
            attempts[idx] += 1
            if attempts[idx] >= self.max_unit_attempts:
                raise DapqError(f"{units[idx].label}: {attempts[idx]} workers died running it; "
                                f"giving up ({_telling_line(exc)})") from None
            queue.appendleft(idx)
        if self.deaths > self.max_restarts:
            raise DapqError(f"{self.deaths} Ray workers died; giving up ({_telling_line(exc)})") from None
        self._start()  # a replacement

    def _lost(self, actor, exc: BaseException, unit) -> None:
        self.deaths += 1
        self._drop(actor)
        what = f"while running {unit.label}" if unit is not None else "while starting"
        self.echo(f"a Ray worker died {what}; its work runs again on another worker ({_telling_line(exc)})")

    def close(self) -> None:
        """Stop the actors, and the local Ray if this executor started it."""
        for actor in list(getattr(self, "_actors", [])):
            self._drop(actor)
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
        self._started_ray = False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class GenerateBatch:
    """A callable class for ``Dataset.map_batches``: one model and one method per actor.

    Parameters
    ----------
    model : str, optional
        As for :func:`dapq.load_model` (default: the embedded SmolLM2-135M).
    method : str
        A method name, or ``name(key=value,...)`` as in ``dapq bench --methods``.
    budget, keep_fraction : optional
        The method's budget (prompt tokens kept per KV head) or kept fraction.
    max_new_tokens, chat, answer_prefix
        As for ``dapq generate``.
    column : str
        The input column: prompt texts, or chats (lists of ``{"role", "content"}``) when it is
        ``messages``.
    dtype, device, attn_implementation : str
        As for :func:`dapq.load_model`.
    model_spec : ModelSpec, optional
        Overrides ``model``/``dtype``/``device``/``attn_implementation``.
    threads : int, optional
        torch threads of the actor (set it to the CPUs the actor pool reserves per actor).

    Each call runs the batch's prompts as one left-padded :func:`dapq.generate` call and returns
    the input columns plus the fields of ``dapq generate --json`` (``config`` as a JSON string).
    """

    def __init__(self, model: str | None = None, method: str = "dapq", budget: int | None = None,
                 keep_fraction: float | None = None, max_new_tokens: int = 64, chat: bool = False,
                 answer_prefix: str | None = None, column: str = "prompt", dtype: str = "float32",
                 device: str | None = None, attn_implementation: str = "sdpa", model_spec: ModelSpec | None = None,
                 threads: int | None = None):
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.method = method_of_record({"method": method}, MethodDefaults(budget=budget, keep_fraction=keep_fraction))
        self.sampling = SamplingConfig(max_new_tokens=max_new_tokens)
        self.chat, self.answer_prefix, self.column = chat, answer_prefix, column
        spec = model_spec or ModelSpec(model, dtype=dtype, device=device, attn_implementation=attn_implementation)
        self.model, self.tokenizer = spec.load()

    def __call__(self, batch: dict) -> dict:
        rows = list(batch[self.column])
        if not rows:  # Ray Data may hand over an empty block
            return batch
        as_messages = self.column == "messages"
        requests = [Request(id=i, line=i + 1, method=self.method,
                            prompt=None if as_messages else str(r),
                            messages=tuple(_plain(m) for m in r) if as_messages else None)
                    for i, r in enumerate(rows)]
        limit = getattr(self.model.config, "max_position_embeddings", None)
        requests = encode_requests(requests, self.tokenizer, f"column {self.column!r}", chat=self.chat,
                                   answer_prefix=self.answer_prefix, max_context=limit,
                                   max_new_tokens=self.sampling.max_new_tokens)
        results = generate(self.model, self.tokenizer, [], self.method, self.sampling,
                           prompt_ids=[list(r.prompt_ids) for r in requests])
        fields = [result_fields(res, self.method) for res in results]
        out = {name: list(values) for name, values in batch.items()}
        for name in fields[0]:
            values = [f[name] for f in fields]
            out[name] = [json.dumps(v) for v in values] if name == "config" else values
        return out


def _plain(message) -> dict:
    # Ray Data hands nested rows back as numpy/arrow-backed mappings; the chat template wants dicts.
    return {"role": str(message["role"]), "content": str(message["content"])}
