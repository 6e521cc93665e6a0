"""kvpress's own pipeline as a peer, run in a child process with its own environment.

kvpress (NVIDIA, ``kvpress==0.5.5``, extra ``dapq[peers]``) is run, never re-implemented. It runs in
a child process for two reasons: ``import kvpress`` wraps transformers' attention functions
process-wide, and dapq's own cells must not run through that wrapper; and kvpress 0.5.5 needs
transformers < 5.3, so where dapq runs on a newer transformers the child is another environment's
interpreter (``$DAPQ_KVPRESS_PYTHON``; the Makefile's ``.venv`` is one). The child loads the model
with dapq's own loader, so both sides see the same weights and tokens.

Two uses:

- **accuracy** (``dapq bench --methods kvpress:SnapKVPress,...``): a persistent child per worker
  (:func:`session`) serves one request per cell over JSON lines: the context and question token ids
  dapq built for the sample, the press and its arguments; it runs kvpress's
  ``KVPressTextGenerationPipeline`` on them (prefill the context under the press, then the question,
  then greedy decoding) and answers with the text and the cache's kept length per layer. The budget
  maps to ``compression_ratio`` so that kvpress keeps the same number of context tokens per KV head
  as dapq's methods (:func:`compression_ratio`).
- **speed** (``dapq bench speed``, the kvpress row): a one-shot child times the pipeline (:func:`run_kvpress`).

What is timed in the speed row. kvpress's pipeline (``KVPressTextGenerationPipeline._forward``)
prefills the context under the press (calling the base model, no LM head), runs the question
tokens, then greedy decodes one token per forward. The prompt is split so that the total input
equals dapq's: context = the prompt minus its last token, question = the last token. So the
question forward yields the first new token exactly like dapq's prefill logits at Lp-1, and ``T``
new tokens cost one prefill, one question forward and ``T - 1`` decode steps on both sides.
Forward hooks on the base model timestamp each of those calls; the end-to-end time is the wall
time of the whole pipeline call, and a decode step is the time from one base-model call to the
next (forward, LM head and argmax, the same span as a step of dapq's decode cells).
End-of-sequence is disabled for the speed run so every repeat decodes all ``T`` tokens.

The pipeline has no batching: it serves one context at a time, so its throughput at batch ``B``
is its batch-1 throughput.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from ..bench.tasks import Sample
from ..bench.units import DEFAULT_PRECISION, Cell, CellGroup, cell_record
from ..errors import DapqError, first_line
from ..generation import GenerationResult
from ..methods.spec import KVPRESS
from ..models import load_model, placeholder_tokenizer, random_model
from ..timing import Timing

PRESSES = {"snapkv": "SnapKVPress", "streamingllm": "StreamingLLMPress"}
PYTHON_ENV = "DAPQ_KVPRESS_PYTHON"


def kvpress_python() -> str:
    """The interpreter that runs kvpress: ``$DAPQ_KVPRESS_PYTHON``, or this one if it has kvpress."""
    explicit = os.environ.get(PYTHON_ENV)
    if explicit:
        if not os.path.isfile(explicit) or not os.access(explicit, os.X_OK):
            raise DapqError(f"${PYTHON_ENV}={explicit}: no such interpreter (not an executable file)")
        return explicit
    if importlib.util.find_spec("kvpress") is not None:
        return sys.executable
    raise DapqError(
        f"kvpress is not installed here: pip install 'dapq[peers]' into an environment with transformers<5.3 "
        f"(kvpress 0.5.5 needs it) and point ${PYTHON_ENV} at its python (the Makefile's .venv is one)")


def compression_ratio(n_kept: int, context_len: int) -> float:
    """kvpress's ``compression_ratio`` that keeps exactly ``n_kept`` of ``context_len`` tokens.

    kvpress keeps ``int(n * (1 - compression_ratio))`` tokens; aiming half a token above
    ``n_kept`` makes float rounding land on ``n_kept``.
    """
    if n_kept < 1:
        raise DapqError(f"{n_kept} of {context_len} context tokens: kvpress must keep something")
    if n_kept >= context_len:  # a budget above a short context keeps it whole, as dapq's methods do
        return 0.0
    return 1.0 - (n_kept + 0.5) / context_len


def kept_tokens(context_len: int, budget: int | None, keep_fraction: float | None) -> int:
    """The context tokens a budget or a kept fraction keeps, as dapq's methods count them."""
    n = budget if budget is not None else max(1, math.ceil(float(keep_fraction) * context_len))
    return min(n, context_len)


#: The speed row's baseline: kvpress's pipeline without a press, timed in the same child and rounds.
NO_PRESS = "none"


def speed_press(name: str) -> str | None:
    """The kvpress class of a speed peer: ``snapkv``, ``streamingllm``, ``kvpress:PressName``; None for the baseline."""
    if name == NO_PRESS:
        return None
    if name.startswith(KVPRESS) and len(name) > len(KVPRESS):
        return name[len(KVPRESS):]
    if name in PRESSES:
        return PRESSES[name]
    raise DapqError(f"no kvpress peer {name!r}; choose from {', '.join(PRESSES)} or kvpress:PressName")


def press_kwargs(name: str, budget: int, context_len: int) -> dict:
    """kvpress arguments of the speed row that keep exactly ``budget`` context tokens.

    ``snapkv`` and ``streamingllm`` take dapq's settings of the same method; a ``kvpress:PressName``
    its own defaults.
    """
    speed_press(name)
    if budget >= context_len:
        raise DapqError(f"budget {budget} keeps the whole {context_len}-token context; nothing to compress")
    ratio = compression_ratio(budget, context_len)
    if name == "snapkv":
        return {"compression_ratio": ratio, "window_size": 8, "kernel_size": 7}  # dapq's SnapKV settings
    if name == "streamingllm":
        return {"compression_ratio": ratio, "n_sink": 4}
    return {"compression_ratio": ratio}


def run_kvpress(spec: dict, *, timeout: float = 3600) -> list[dict]:
    """Run the speed peer in a child process; ``spec`` is what :func:`_speed_child` reads (see there).

    Returns one record per press. A missing or failing kvpress becomes one record with an
    ``error``, so the benchmark carries on.
    """
    try:
        python = kvpress_python()
    except DapqError as exc:
        return [{"label": "kvpress", "error": str(exc)}]
    try:
        proc = subprocess.run([python, "-m", "dapq.integrations.kvpress_peer", "speed"],
                              input=json.dumps(spec), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [{"label": "kvpress", "error": f"timed out after {timeout:.0f} s"}]
    except OSError as exc:  # the interpreter does not run (wrong format, permissions)
        return [{"label": "kvpress", "error": f"{python} did not start: {exc.strerror or exc}"}]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    baseline = next((r.get("runs") for r in rows if r.get("label") == f"kvpress-{NO_PRESS}"), None)
    for row in rows:
        if baseline and row.get("runs") and row["label"] != f"kvpress-{NO_PRESS}":
            # The press's prefill against the pipeline's own without a press, round by round.
            ratios = [a["prefill_s"] / b["prefill_s"] for a, b in zip(row["runs"], baseline, strict=False)]
            row["prefill_ratio_to_no_press"] = statistics.median(ratios)
    rows = [_summarise(row) for row in rows]
    if proc.returncode != 0 and not any("error" in r for r in rows):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        rows.append({"label": "kvpress", "error": f"exit code {proc.returncode}: {last[:300]}"})
    return rows


def _summarise(row: dict) -> dict:
    """Medians and spreads of the child's raw runs, in the same shape as dapq's cells."""

    runs = row.pop("runs", None)
    if not runs:
        return row
    steps = [r["decode_steps_s"] for r in runs]
    rates = Timing([len(s) / sum(s) for s in steps if s])
    row.update(
        e2e_s=Timing([r["e2e_s"] for r in runs]).to_dict(),
        ttft_s=Timing([r["first_token_s"] for r in runs]).to_dict(),
        forward_s=Timing([r["prefill_s"] for r in runs]).to_dict(),
        tokens_per_s=rates.median,
        tokens_per_s_spread=list(rates.spread),
        runs=runs,
    )
    return row


def _load(spec: dict):
    import torch
    torch.set_num_threads(spec["threads"])
    if spec.get("random_weights"):
        model = random_model(spec["random_weights"], dtype=spec["dtype"], device=spec["device"],
                             attn_implementation=spec["attn"], seed=spec.get("seed", 0))
        tokenizer = placeholder_tokenizer()
    else:
        model, tokenizer = load_model(spec.get("model"), dtype=spec["dtype"], device=spec["device"],
                                      attn_implementation=spec["attn"])
    return model, tokenizer


def _timer(model):
    """Hooks that time each outermost base-model call; returns ``(calls, sync, remove)``.

    ``calls`` collects ``(start, end, tokens)`` per call, ``tokens`` being the call's input length.
    The length tells the pipeline's calls apart: the context prefill, then any scoring passes a
    press runs after it (KVzip replays the context in chunks), then the question and the 1-token
    decoding steps.
    """
    import torch

    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    calls: list[tuple[float, float, int]] = []
    depth, opened = [0], [0.0, 0]

    def before(_module, args, kwargs):
        depth[0] += 1
        if depth[0] == 1:
            x = kwargs.get("input_ids", args[0] if args else None)
            x = x if x is not None else kwargs["inputs_embeds"][..., 0]
            sync()
            opened[:] = [time.perf_counter(), int(x.shape[-1])]

    def after(*_):
        depth[0] -= 1
        if depth[0] == 0:
            sync()
            calls.append((opened[0], time.perf_counter(), opened[1]))

    base = model.get_decoder()
    hooks = [base.register_forward_pre_hook(before, with_kwargs=True), base.register_forward_hook(after)]
    return calls, sync, lambda: [h.remove() for h in hooks]


def _time_once(pipe, press, ids, steps: int, calls: list, sync) -> dict:
    """One pipeline call: context = ``ids[:-1]`` under ``press``, question = the last token, ``steps`` tokens.

    ``prefill_s`` runs from the call to the start of the question's forward: the context prefill
    with the press's scoring and eviction, wherever the press does them (in the prefill's hooks,
    or in passes of its own after it, as KVzip).
    """
    import torch

    model = pipe.model
    context = torch.tensor([ids[:-1]], device=model.device)
    question = torch.tensor([ids[-1:]], device=model.device)
    calls.clear()
    sync()
    start = time.perf_counter()
    with torch.no_grad():
        pipe._forward({"context_ids": context, "questions_ids": [question]}, max_new_tokens=steps, press=press)
    sync()
    total = time.perf_counter() - start
    # The question's forward is the first 1-token call after the context's (scoring passes replay
    # the context in chunks far longer than one token).
    q = next(i for i in range(1, len(calls)) if calls[i][2] == question.shape[-1])
    # A decode step runs from one base-model call to the next: the forward, the LM head and the
    # argmax, as in dapq's decode cells; the last one ends with the pipeline call.
    starts = [a for a, _, _ in calls[q + 1:]] + [start + total]
    return {"e2e_s": total, "prefill_s": calls[q][0] - start, "first_token_s": calls[q][1] - start,
            "decode_steps_s": [b - a for a, b in zip(starts, starts[1:], strict=False)]}


def _speed_child() -> int:
    """Read a JSON spec on stdin, print one JSON record per press on stdout.

    Spec: ``model`` or ``random_weights``, ``dtype``, ``device``, ``attn``, ``threads``,
    ``ids`` (the prompt token ids), ``budget``, ``presses``, ``decode_tokens``, ``repeats``,
    ``warmup``.
    """
    from importlib.metadata import version

    spec = json.loads(sys.stdin.read())
    try:
        import kvpress
        from kvpress.pipeline import KVPressTextGenerationPipeline
    except ImportError:
        print(json.dumps({"label": "kvpress", "error": "kvpress is not installed (pip install 'dapq[peers]')"}))
        return 3
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model, tokenizer = _load(spec)
    model.generation_config.eos_token_id = None  # kvpress stops at EOS; every repeat decodes T tokens
    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer)
    ids = spec["ids"]
    rows = []
    for name in spec["presses"]:
        cls = speed_press(name)
        kwargs = None if cls is None else press_kwargs(name, spec["budget"], len(ids) - 1)
        press = None if cls is None else getattr(kvpress, cls)(**kwargs)
        rows.append(({"label": f"kvpress-{name}", "press": cls, "press_kwargs": kwargs,
                      "kvpress_version": version("kvpress"), "runs": []}, press))
    calls, sync, remove = _timer(model)
    try:
        # Presses in turns (A, B, C, then B, C, A, ...), as dapq's TTFT cells are timed: drift of
        # this machine hits every press alike, and ratios are taken round by round.
        for i in range(spec["warmup"] + spec["repeats"]):
            for j in range(len(rows)):
                row, press = rows[(i + j) % len(rows)]
                run = _time_once(pipe, press, ids, spec["decode_tokens"], calls, sync)
                if i >= spec["warmup"]:
                    row["runs"].append(run)
    finally:
        remove()
    for row, _ in rows:
        print(json.dumps(row), flush=True)
    return 0


# --------------------------------------------------------------------------- accuracy cells
def check_presses(presses: list[tuple[str, dict]]) -> None:
    """Fail early, in one line, on a press kvpress does not have or an argument it does not take.

    Asks the kvpress interpreter (a second or two: it imports kvpress) before any model loads.
    """
    python = kvpress_python()
    try:
        proc = subprocess.run([python, "-m", "dapq.integrations.kvpress_peer", "check"],
                              input=json.dumps(presses), capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DapqError(f"kvpress ({python}) did not start: {getattr(exc, 'strerror', None) or exc}") from None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise DapqError(f"kvpress ({python}) did not start: {last[:300]}")
    error = json.loads(lines[-1]).get("error")
    if error:
        raise DapqError(error)


def _check_child() -> int:
    """Read ``[[press name, kwargs], ...]``; print ``{"error": ...}`` for the first bad one, or ``{}``."""
    import dataclasses

    import kvpress

    for name, kwargs in json.loads(sys.stdin.read()):
        cls = getattr(kvpress, name, None)
        if not isinstance(cls, type) or not issubclass(cls, kvpress.BasePress):
            presses = sorted(n for n in dir(kvpress) if n.endswith("Press") and n != "BasePress")
            print(json.dumps({"error": f"kvpress has no press {name!r}; it has {', '.join(presses)}"}))
            return 0
        fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
        unknown = sorted(set(kwargs) - fields)
        if unknown or "compression_ratio" not in fields or "compression_ratio" in kwargs:
            why = (f"takes no {', '.join(unknown)}" if unknown else
                   "has no compression_ratio (only presses with one map to a budget)"
                   if "compression_ratio" not in fields else "gets compression_ratio from the budget")
            print(json.dumps({"error": f"kvpress:{name} {why}; its arguments: {', '.join(sorted(fields))}"}))
            return 0
        bad = _bad_argument(cls, kwargs)
        if bad:
            print(json.dumps({"error": f"kvpress:{name}: {bad}"}))
            return 0
    print(json.dumps({}))


def _bad_argument(cls, kwargs: dict) -> str | None:
    """A press argument of the wrong type or sign, or one the press's own checks refuse; else None.

    kvpress declares no ranges, so the rule is read off each field's default: a number keeps its
    default's type (an int stays an int) and, where the default is not negative (window sizes,
    counts, scales), its sign. Then the press is built, so its ``__post_init__`` checks run now
    and not after the model has loaded.
    """
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    for key, value in kwargs.items():
        default = defaults.get(key)
        if isinstance(default, bool) or not isinstance(default, int | float):
            continue
        want = int if isinstance(default, int) else (int, float)
        if isinstance(value, bool) or not isinstance(value, want):
            return f"{key} must be {'an integer' if want is int else 'a number'}, got {value!r}"
        if default >= 0 and value < 0:
            return f"{key} must not be negative, got {value!r}"
    try:
        cls(**kwargs, compression_ratio=0.5)
    except Exception as exc:  # noqa: BLE001  (any refusal of kvpress's own checks is the user's input)
        return f"{type(exc).__name__}: {first_line(exc, repr(exc))}"
    return None
    return 0


@dataclass(frozen=True)
class PeerUnit(CellGroup):
    """The kvpress cells of one sample: each through kvpress's own pipeline, in a child process.

    The child (:func:`session`) loads ``model`` once per worker and
    gets the same token ids as dapq's cells of the sample: the context and the question in
    context mode; in prompt mode the prompt minus its last token, then that token as the question
    (so the first new token comes from the same position as dapq's). The budget or kept fraction maps to
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
    precision: tuple[str, str] = DEFAULT_PRECISION

    @property
    def label(self) -> str:
        return f"{self.sample.task} {self.sample.sample_id}: {len(self.cells)} kvpress cells"

    def run(self, model, tokenizer) -> list[dict]:
        import torch  # the child's own interpreter imports this module too, without a model

        s = self.sample
        if self.question_ids is None:
            context, question = list(self.prompt_ids[:-1]), list(self.prompt_ids[-1:])
        else:
            context, question = list(self.prompt_ids), list(self.question_ids)
        child = session({**self.model, "threads": torch.get_num_threads()})
        records = []
        for cell in self.cells:
            n_kept = kept_tokens(len(context), cell.budget, cell.keep_fraction)
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
            config = {**cell.spec.config(cell.budget, cell.keep_fraction), "compression_ratio": kwargs["compression_ratio"],
                      "kvpress_version": child.kvpress_version}
            if sum(answer.get("masked", ())):
                # Held in memory but never attended: the KV bytes stay physical, this says how much is dead.
                config["masked_fraction"] = sum(answer["masked"]) / (sum(kept) * answer["kv_heads"])
            records.append(cell_record(self, cell, config, result, answer["seconds"]))
        return records


class KvpressSession:
    """A child process that holds one model and answers kvpress requests, one JSON line each.

    Use :func:`session`, which keeps one per interpreter and model for the life of this process.
    """

    def __init__(self, python: str, model: dict):
        self.python = python
        # stderr is drained by a thread (a full pipe would block the child); its last lines
        # explain a child that died.
        try:
            self.proc = subprocess.Popen([python, "-m", "dapq.integrations.kvpress_peer", "serve"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True, bufsize=1)
        except OSError as exc:
            raise DapqError(f"kvpress peer ({python}) did not start: {exc.strerror or exc}") from None
        self._errors: list[str] = []
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()
        self._lock = threading.Lock()
        try:
            ready = self._call(model)
            if "error" in ready:
                raise DapqError(f"kvpress peer: {ready['error']}")
        except BaseException:
            self.close()
            raise
        self.kvpress_version = ready["kvpress"]

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self._errors = (self._errors + [line.rstrip()])[-20:]

    def _call(self, message: dict) -> dict:
        with self._lock:
            try:
                self.proc.stdin.write(json.dumps(message) + "\n")
                self.proc.stdin.flush()
                line = self.proc.stdout.readline()
            except (BrokenPipeError, OSError):
                line = ""
        if not line:
            # The child is gone: let the drain thread read its last stderr lines, which say why.
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self._drainer.join(timeout=1)
            last = next((e for e in reversed(self._errors) if e.strip()), "no output")
            raise DapqError(f"kvpress peer ({self.python}) stopped: {last[:300]}")
        try:
            return json.loads(line)
        except ValueError:
            raise DapqError(f"kvpress peer ({self.python}) answered out of protocol: {line[:200]!r}") from None

    def generate(self, request: dict) -> dict:
        """Run one request (see :func:`_serve_child`); a press error is raised as a DapqError."""
        answer = self._call(request)
        if "error" in answer:
            raise DapqError(f"kvpress {request.get('press')}: {answer['error']}")
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


_SESSIONS: dict[tuple, KvpressSession] = {}


def session(model: dict) -> KvpressSession:
    """The kvpress child of this process for ``model`` (``name``, ``dtype``, ``device``, ``attn``, ``threads``).

    Started on first use and kept, so a worker loads the model into its kvpress child once.
    """
    python = kvpress_python()
    key = (python, json.dumps(model, sort_keys=True))
    live = _SESSIONS.get(key)
    if live is None or live.proc.poll() is not None:
        _SESSIONS[key] = live = KvpressSession(python, model)
    return live


@atexit.register
def _close_sessions() -> None:
    for live in _SESSIONS.values():
        live.close()
    _SESSIONS.clear()


def _serve_child() -> int:
    """Answer kvpress requests: the first line is the model, each further line one request.

    Model: ``name`` (None: the embedded model), ``dtype``, ``device``, ``attn``, ``threads``.
    Request: ``press`` (a kvpress class name), ``kwargs`` (its arguments), ``context_ids``,
    ``question_ids``, ``max_new_tokens``. Answer: ``text``, ``kept`` (the cache's length per layer
    after compression), ``masked`` (per layer, the (head, token) entries a head-wise press masks
    instead of evicting), ``token_bytes`` (a token's keys and values in one layer) and ``seconds``
    (the pipeline call), or ``error``.
    """
    from importlib.metadata import version

    # The answers travel on a private copy of stdout; file descriptor 1 then points at stderr, so
    # whatever a library prints (kvpress's FastKVzipPress prints to stdout) cannot break the protocol.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    model_line = sys.stdin.readline()
    try:
        import kvpress
        import torch
        from kvpress.pipeline import KVPressTextGenerationPipeline
        from transformers import DynamicCache
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
        spec = json.loads(model_line)
        torch.set_num_threads(spec["threads"])
        model, tokenizer = load_model(spec["name"], dtype=spec["dtype"], device=spec["device"],
                                      attn_implementation=spec["attn"])
        pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer)
    except Exception as exc:  # anything that stops the child from serving is reported, then it exits
        print(json.dumps({"error": f"{type(exc).__name__}: {first_line(exc)}"}),
              file=proto)
        return 3
    print(json.dumps({"ready": True, "kvpress": version("kvpress")}), file=proto)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            press_cls = getattr(kvpress, request["press"], None)
            if not isinstance(press_cls, type) or not issubclass(press_cls, kvpress.BasePress):
                raise ValueError(f"kvpress {version('kvpress')} has no press {request['press']!r}")
            press = press_cls(**request["kwargs"])
            cache = DynamicCache()
            inputs = {"context_ids": torch.tensor([request["context_ids"]], device=model.device),
                      "questions_ids": [torch.tensor([request["question_ids"]], device=model.device)]}
            start = time.perf_counter()
            with torch.no_grad():
                # The pipeline's own forward: context prefill under the press, the question, greedy
                # decoding; it leaves the compressed context in the cache.
                text = pipe._forward(inputs, max_new_tokens=request["max_new_tokens"], press=press, cache=cache)[0]
            keys = cache.layers[0].keys
            # Head-wise presses (KVzip, AdaKV, CriticalKV, DuoAttention) evict nothing: they mark keys
            # in `masked_key_indices`, which kvpress's attention patch overwrites with keys that get
            # no attention. The cache keeps its size; the masked entries are reported beside it.
            masked = [getattr(layer.self_attn, "masked_key_indices", None) for layer in model.model.layers]
            answer = {"text": text, "kept": [cache.get_seq_length(i) for i in range(len(cache))],
                      "masked": [0 if m is None else int(m[0].numel()) for m in masked], "kv_heads": keys.shape[1],
                      "token_bytes": 2 * keys.shape[1] * keys.shape[3] * keys.element_size(),
                      "seconds": time.perf_counter() - start}
        except Exception as exc:  # a press that fails answers with its error; the child serves on
            answer = {"error": f"{type(exc).__name__}: {first_line(exc)}"}
        print(json.dumps(answer), file=proto)
    return 0


def main(argv: list[str]) -> int:
    modes = {"speed": _speed_child, "serve": _serve_child, "check": _check_child}
    if len(argv) != 1 or argv[0] not in modes:
        print(f"usage: python -m dapq.integrations.kvpress_peer {{{','.join(modes)}}}", file=sys.stderr)
        return 2
    return modes[argv[0]]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
