"""Bulk generation: a JSONL file of prompts in, a resumable JSONL file of generations out.

Each input line is one request::

    {"id": "q1", "prompt": "text ...", "method": "snapkv", "budget": 64}
    {"id": "q2", "messages": [{"role": "user", "content": "..."}], "keep_fraction": 0.1}

``id`` (a string or an integer, unique in the file) and exactly one of ``prompt`` (text;
``--chat`` wraps it as one user turn) or ``messages`` (a chat, rendered with the tokenizer's chat
template) are required. ``method`` (a name, or ``name(key=value,...)`` as in ``dapq bench
--methods``), ``budget`` and ``keep_fraction`` are optional and default to the command's
``--method``, ``--budget`` and ``--keep-fraction``; a record's ``method`` replaces the command's
method with its ``--window``, ``--content`` and ``--preset``.

Each output line is what ``dapq generate --json`` prints, plus the request's ``id``. Requests of
one method are run as left-padded batches of similar length (one :func:`~dapq.generation.generate`
call each; greedy outputs equal running each prompt alone). The output file is resumable like a
sweep's results: ids already in it are skipped, a torn last line is dropped, and it is locked
against a second writer while a run appends to it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import DapqError
from .generation import SamplingConfig, generate
from .methods.base import Method
from .methods.registry import build_from_options
from .methods.spec import KVPRESS, parse_methods
from .prompts import encode_prompts
from .runs.executor import Executor, write_results
from .runs.log import JsonlLog, json_objects


class GenerationLog(JsonlLog):
    """The output file of a bulk generation: one JSON object per finished request, keyed by ``id``.

    The file itself is the lock while it is open for writing, so no lock file sits next to it.
    """

    key_field = "id"
    required = ("id", "text")
    kind = "dapq generation output"

    def __init__(self, path: str | Path, *, writable: bool = True):
        super().__init__(path, lock_path=path, writable=writable)


@dataclass(frozen=True)
class MethodDefaults:
    """The command's method options, for requests that do not name their own."""

    method: str = "dapq"
    budget: int | None = None
    keep_fraction: float | None = None
    window: int | None = None
    content: str | None = None
    preset: str | None = None


@dataclass(frozen=True)
class Request:
    """One validated input line; ``prompt_ids`` is filled in by :func:`encode_requests`."""

    id: str | int
    line: int
    method: Method
    prompt: str | None = None
    messages: tuple | None = None
    prompt_ids: tuple[int, ...] = ()


def result_fields(result, method: Method) -> dict:
    """The fields of ``dapq generate --json`` for one :class:`~dapq.generation.GenerationResult`."""
    record = result.to_dict()
    record["budget"] = method.budget if method.budget is not None else max(result.kept_tokens_per_head)
    record["keep_fraction"] = method.keep_fraction
    return record


def method_of_record(rec: dict, defaults: MethodDefaults) -> Method:
    """The method of one request: its own ``method``/``budget``/``keep_fraction``, else the command's defaults."""
    if "ratio" in rec:
        raise DapqError("'ratio' is now 'keep_fraction' (the fraction of the prompt kept)")
    own_budget = "budget" in rec or "keep_fraction" in rec
    budget = rec.get("budget") if own_budget else defaults.budget
    fraction = rec.get("keep_fraction") if own_budget else defaults.keep_fraction
    if budget is not None and fraction is not None:
        raise DapqError("give a budget or a keep_fraction, not both")
    if "method" not in rec and "(" not in defaults.method:
        return build_from_options(defaults.method, budget=budget, keep_fraction=fraction, window=defaults.window,
                                  content=defaults.content, preset=defaults.preset)
    if "method" not in rec:  # the command's --method written as a spec, e.g. dapq(n_pseudo=16)
        if defaults.window is not None or defaults.content is not None or defaults.preset is not None:
            raise DapqError("give the method's parameters inside --method (name(key=value,...)) or as "
                            "--window/--content/--preset, not both")
        rec = {**rec, "method": defaults.method}
    if not isinstance(rec["method"], str):
        raise DapqError("method must be a string such as \"snapkv\" or \"dapq(n_pseudo=16)\"")
    if rec["method"].startswith(KVPRESS):
        raise DapqError("bulk generation runs dapq's methods; kvpress presses run as peers in dapq bench")
    specs = parse_methods(rec["method"])
    if len(specs) != 1:
        raise DapqError(f"one method per request, got {rec['method']!r}")
    spec = specs[0]
    if spec.evicts and budget is None and fraction is None:
        raise DapqError(f"method {spec.name!r} needs a budget or a keep_fraction (in the record or as "
                        "--budget/--keep-fraction)")
    return spec.build(budget, fraction)


def _messages(value) -> tuple:
    if not isinstance(value, list) or not value:
        raise DapqError("messages must be a non-empty list of {\"role\": ..., \"content\": ...}")
    for m in value:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise DapqError("each message needs a string role and a string content")
    return tuple({"role": m["role"], "content": m["content"]} for m in value)


def read_requests(path: str | Path, defaults: MethodDefaults) -> list[Request]:
    """Parse and validate an input file; any bad line is a :class:`DapqError` naming file and line."""
    path = Path(path)
    if path.is_dir():
        raise DapqError(f"{path}: is a directory, not a JSONL file of requests")
    if not path.is_file():
        raise DapqError(f"{path}: no such file")
    requests: list[Request] = []
    seen: dict = {}
    for number, rec in json_objects(path, "a request per line"):
        where = f"{path}:{number}"
        try:
            requests.append(_request(rec, number, defaults, seen))
        except DapqError as exc:
            raise DapqError(f"{where}: {exc}") from None
    if not requests:
        raise DapqError(f"{path}: no requests")
    return requests


def _request(rec: dict, number: int, defaults: MethodDefaults, seen: dict) -> Request:
    """One input line as a request (``seen``: the ids so far, with their lines)."""
    rid = rec.get("id")
    if isinstance(rid, bool) or not isinstance(rid, str | int) or rid == "":
        raise DapqError("missing id (a non-empty string or an integer)")
    if rid in seen:
        raise DapqError(f"duplicate id {rid!r} (first on line {seen[rid]})")
    seen[rid] = number
    if ("prompt" in rec) == ("messages" in rec):
        raise DapqError("give exactly one of prompt and messages")
    if "prompt" in rec:
        if not isinstance(rec["prompt"], str) or not rec["prompt"].strip():
            raise DapqError("the prompt must be a non-empty string")
        prompt, messages = rec["prompt"], None
    else:
        prompt, messages = None, _messages(rec["messages"])
    return Request(id=rid, line=number, method=method_of_record(rec, defaults), prompt=prompt, messages=messages)


def encode_requests(requests: Sequence[Request], tokenizer, path: str | Path, *, chat: bool = False,
                    answer_prefix: str | None = None, max_context: int | None = None,
                    max_new_tokens: int = 64) -> list[Request]:
    """Tokenise every request (chat template for ``messages``), checking it fits the model."""
    out = []
    for r in requests:
        where = f"{path}:{r.line}"
        try:
            if r.messages is not None:
                if not getattr(tokenizer, "chat_template", None):
                    raise DapqError("messages need a tokenizer with a chat template")
                text = tokenizer.apply_chat_template(list(r.messages), add_generation_prompt=True, tokenize=False)
                ids = tokenizer(text + (answer_prefix or ""), add_special_tokens=False)["input_ids"]
                if not ids:
                    raise DapqError("a prompt tokenizes to nothing")
            else:
                ids = encode_prompts(tokenizer, [r.prompt], chat=chat, answer_prefix=answer_prefix)[0]
        except DapqError as exc:
            raise DapqError(f"{where}: {exc}") from None
        if max_context is not None and len(ids) + max_new_tokens > max_context:
            raise DapqError(f"{where}: prompt of {len(ids)} tokens + {max_new_tokens} new tokens exceeds the "
                            f"model's context of {max_context}")
        out.append(Request(id=r.id, line=r.line, method=r.method, prompt=r.prompt, messages=r.messages,
                           prompt_ids=tuple(ids)))
    return out


@dataclass(frozen=True)
class GenerationUnit:
    """Requests of one method, generated as one left-padded batch on one worker."""

    requests: tuple[Request, ...]
    method: Method
    sampling: SamplingConfig
    shared: dict = dataclasses.field(default_factory=dict)
    """What the whole run shares and the output depends on (model, dtype, device): in each settings."""

    @property
    def keys(self) -> tuple:
        return tuple(r.id for r in self.requests)

    @property
    def label(self) -> str:
        return f"{self.method.name}: {len(self.requests)} prompt(s)"

    def run(self, model, tokenizer) -> list[dict]:
        results = generate(model, tokenizer, [], self.method, self.sampling,
                           prompt_ids=[list(r.prompt_ids) for r in self.requests])
        return [{"id": r.id, **result_fields(res, self.method), "settings": settings(r, self.sampling, self.shared)}
                for r, res in zip(self.requests, results, strict=True)]


def settings(request: Request, sampling: SamplingConfig, run: dict | None = None) -> dict:
    """Everything that decides a request's output, as stored with its record (JSON-normal form).

    ``run`` holds what every request of the run shares (the model, dtype and device). The decode
    mode is left out: every mode gives the same tokens (``tests/test_decoding.py``).
    """
    fields = {
        **(run or {}), "method": request.method.config(), "budget": request.method.budget,
        "keep_fraction": request.method.keep_fraction,
        "sampling": {k: v for k, v in dataclasses.asdict(sampling).items() if k != "decode"},
        "prompt_sha256": hashlib.sha256(json.dumps(list(request.prompt_ids)).encode()).hexdigest()[:16],
    }
    return json.loads(json.dumps(fields, default=str))


def changed_requests(requests: Sequence[Request], log: GenerationLog, sampling: SamplingConfig,
                     run: dict | None = None) -> list[str]:
    """Finished requests whose stored settings differ from this run's: ``"id (what changed)"`` each.

    Records written before settings were stored cannot be checked and are taken as they are.
    """
    out = []
    for r in requests:
        stored = (log.get(r.id) or {}).get("settings")
        if stored is None:
            continue
        now = settings(r, sampling, run)
        diff = [k for k in now if k != "sampling" and stored.get(k) != now[k]]
        diff += [k for k, v in now["sampling"].items() if stored.get("sampling", {}).get(k) != v]
        if diff:
            out.append(f"{r.id!r} ({', '.join(diff)})")
    return out


def generation_units(requests: Sequence[Request], sampling: SamplingConfig, batch_size: int = 4,
                     run: dict | None = None) -> list[GenerationUnit]:
    """Batches of up to ``batch_size`` requests that share a method, neighbours in length.

    Sorting by length within a method keeps left padding (wasted prefill work) small.
    """
    if batch_size < 1:
        raise DapqError("--batch-size must be >= 1")
    groups: dict[str, list[Request]] = {}
    for r in requests:
        groups.setdefault(json.dumps(r.method.config(), sort_keys=True, default=str), []).append(r)
    units = []
    for group in groups.values():
        group = sorted(group, key=lambda r: len(r.prompt_ids))
        for start in range(0, len(group), batch_size):
            chunk = tuple(group[start : start + batch_size])
            units.append(GenerationUnit(requests=chunk, method=chunk[0].method, sampling=sampling, shared=dict(run or {})))
    return units


def run_bulk(executor: Executor, requests: Sequence[Request], log: GenerationLog, *, sampling: SamplingConfig,
             batch_size: int = 4, show_progress: bool = True, run: dict | None = None) -> int:
    """Generate every request whose id is not in ``log`` yet; returns the records written.

    A finished request whose method, budget, sampling, prompt or ``run`` settings (the model,
    dtype and device, as the caller names them) differ from this run's is refused (one
    :class:`DapqError` naming them) rather than kept under settings it was not made with.
    """
    changed = changed_requests(requests, log, sampling, run)
    if changed:
        shown = "; ".join(changed[:3]) + (f"; and {len(changed) - 3} more" if len(changed) > 3 else "")
        raise DapqError(f"{log.path}: {len(changed)} finished request(s) were made with other settings: {shown}. "
                        "Give another --output, or delete their lines to generate them again")
    todo = [r for r in requests if r.id not in log]
    units = generation_units(todo, sampling, batch_size, run)
    return write_results(executor, units, log, show_progress=show_progress, description="generate")
