"""The sweep runner: every (method, budget, sample) cell, resumable through the results store.

There is one runner for every executor: it computes the pending cells, groups them into work
units, and writes what the executor (local or Ray, :mod:`dapq.bench.executor`) hands back.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..context import encode_context, encode_question
from ..errors import ConfigError, DapqError
from ..generation import encode_prompts
from ..methods import build, method_class
from .executor import Cell, Executor, LocalExecutor, PeerUnit, WorkUnit, write_results
from .store import ResultsStore, cell_key
from .tasks import Sample

if TYPE_CHECKING:
    from ..models import ModelSpec


@dataclass(frozen=True)
class MethodSpec:
    """A method name plus fixed parameters, e.g. ``dapq(keep_recent=32,content=random_vocab)``.

    A name ``kvpress:PressName`` is a kvpress press, run as a peer through kvpress's own pipeline
    (:mod:`dapq.integrations.kvpress_peer`); its parameters are the press's arguments.
    """

    label: str
    name: str
    params: tuple[tuple[str, object], ...] = ()

    @property
    def peer(self) -> str | None:
        """``"kvpress"`` for a kvpress press, None for a dapq method."""
        return "kvpress" if self.name.startswith(KVPRESS) else None

    def build(self, budget: int | None = None, ratio: float | None = None):
        """The dapq method with this budget or ratio (FullKV takes neither)."""
        if self.peer:
            raise ConfigError(f"{self.label} is a kvpress press, not a dapq method")
        params = dict(self.params)
        try:
            if self.name == "full":
                return build(self.name, **params)
            return build(self.name, budget=budget, keep_fraction=ratio, **params)
        except (TypeError, ValueError) as exc:  # a parameter of the wrong type, e.g. window='x'
            raise ConfigError(f"{self.label}: bad parameter ({exc})") from None

    def config(self, budget: int | None = None, ratio: float | None = None) -> dict:
        """What determines this cell's result, as recorded (and hashed into its key)."""
        if self.peer:
            return {"method": self.name, "press": self.name[len(KVPRESS):], "press_kwargs": dict(self.params),
                    "budget": budget, "ratio": ratio}
        return self.build(budget, ratio).config()


KVPRESS = "kvpress:"


def parse_methods(spec: str) -> list[MethodSpec]:
    """Parse ``full,dapq,snapkv(window=16,kernel=5),kvpress:TOVAPress`` into method specs (validated)."""
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
        m = re.fullmatch(r"([a-z_0-9]+|kvpress:[A-Za-z_0-9]+)(?:\((.*)\))?", raw)
        if not m:
            raise ConfigError(f"cannot parse method {raw!r}; write name, name(key=value,...) or kvpress:PressName(...)")
        name, args = m.group(1), m.group(2)
        if not name.startswith(KVPRESS):
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
        if out[-1].peer is None:
            out[-1].build(64)  # validate parameters now, not an hour into the sweep
    peers = [s for s in out if s.peer]
    if peers:
        from ..integrations.kvpress_peer import check_presses

        check_presses([(s.name[len(KVPRESS):], dict(s.params)) for s in peers])
    return out


def parse_budgets(text: str) -> list[int]:
    try:
        budgets = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise ConfigError(f"budgets must be integers, got {text!r}") from None
    if not budgets or any(b < 1 for b in budgets):
        raise ConfigError(f"budgets must be integers >= 1, got {text!r}")
    return budgets


def parse_ratios(text: str) -> list[float]:
    """``--ratios 0.25,0.5``: fractions of each prompt (or context) kept, in (0, 1)."""
    try:
        ratios = [float(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise ConfigError(f"ratios must be numbers, got {text!r}") from None
    if not ratios or any(not 0.0 < r < 1.0 for r in ratios):
        raise ConfigError(f"ratios must lie in (0, 1) (the fraction kept), got {text!r}")
    return ratios


def cells(methods: list[MethodSpec], budgets: list[int], ratios: list[float] = ()
          ) -> list[tuple[MethodSpec, int | None, float | None]]:
    """FullKV runs once (no budget); every other method once per budget and once per ratio."""
    out = []
    for spec in methods:
        if spec.name == "full":
            out.append((spec, None, None))
        else:
            out.extend((spec, b, None) for b in budgets)
            out.extend((spec, None, r) for r in ratios)
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
    ratios: list[float] = (),
    compress: str = "prompt",
    model_spec: ModelSpec | None = None,
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

    ``compress="context"`` compresses each sample's context part only (``Sample.context_end``)
    and feeds its question uncompressed after it (:mod:`dapq.context`); ``"prompt"`` compresses
    the whole prompt, the paper's setting. ``ratios`` adds cells that keep a fraction of each
    prompt (or context) instead of a token budget. kvpress presses in ``methods`` run through
    kvpress's own pipeline in a child process that loads ``model_spec``.

    The pending cells become work units (:func:`work_units`) that ``executor`` runs: by default a
    :class:`~dapq.bench.executor.LocalExecutor` on ``model``; a
    :class:`~dapq.integrations.ray.RayExecutor` spreads them over Ray actors (``model`` may then
    be None, with the model's context length given as ``max_context``). Either way this process
    alone writes ``store``.
    """
    if model is not None:
        max_context = getattr(model.config, "max_position_embeddings", None)
    units = work_units(tokenizer, samples, methods, budgets, store, model_id=model_id, max_context=max_context,
                       shared_prefill=shared_prefill, decode_batch=decode_batch, ratios=ratios, compress=compress,
                       model_spec=model_spec)
    if executor is None:
        executor = LocalExecutor(model, tokenizer)
    return write_results(executor, units, store, show_progress=show_progress)


COMPRESS_MODES = ("prompt", "context")


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
    ratios: list[float] = (),
    compress: str = "prompt",
    model_spec: ModelSpec | None = None,
) -> list:
    """The cells of a sweep missing from ``store``, grouped into work units.

    A shared-prefill unit is every pending dapq (method, budget) cell of one sample (one prefill,
    wherever it runs); with ``shared_prefill=False`` each cell is a unit of its own. The kvpress
    cells of a sample form a :class:`~dapq.bench.executor.PeerUnit`.
    """
    if compress not in COMPRESS_MODES:
        raise ConfigError(f"--compress must be one of {', '.join(COMPRESS_MODES)}, got {compress!r}")
    encoded = {}
    for s in samples:
        if s.sample_id in encoded:  # units are grouped by id: two samples would share one unit's references
            raise DapqError(f"two samples share the id {s.sample_id!r} (NIAH ids round depths to 0.01; "
                            "a data file may repeat an id)")
        ids, question = encode_sample(tokenizer, s, compress)
        total = len(ids) + len(question or ())
        if max_context is not None and total + s.max_new_tokens + 64 > max_context:
            raise DapqError(f"{s.sample_id}: {total} prompt tokens exceed the model's context of {max_context}")
        encoded[s.sample_id] = ids, question
    todo: list[tuple[Sample, Cell]] = []
    for spec, budget, ratio in cells(methods, budgets, ratios):
        config = spec.config(budget, ratio)
        for s in samples:
            # Prompt-mode keys are those of earlier dapq versions, so their results files resume.
            mode = {} if compress == "prompt" else {"compress": compress}
            key = cell_key(model=model_id, sample=s.sample_id, task=s.task, config=config,
                           max_new_tokens=s.max_new_tokens, prompt=s.prompt, chat=s.chat, **mode)
            if key not in store:
                todo.append((s, Cell(key=key, spec=spec, budget=budget, ratio=ratio)))
    peers = [(s, c) for s, c in todo if c.spec.peer]
    if peers and model_spec is None:
        raise ConfigError("kvpress methods need the model's spec (the command line passes it)")

    def unit(s: Sample, group: list[Cell]):
        ids, question = encoded[s.sample_id]
        if group[0].spec.peer:
            return PeerUnit(sample=s, prompt_ids=ids, question_ids=question, cells=tuple(group), model_id=model_id,
                            model=model_spec.peer_fields() if model_spec else {}, compress=compress)
        return WorkUnit(sample=s, prompt_ids=ids, cells=tuple(group), model_id=model_id,
                        shared_prefill=shared_prefill, decode_batch=decode_batch, question_ids=question,
                        compress=compress)

    groups: dict[tuple[str, bool], tuple[Sample, list[Cell]]] = {}
    for s, c in todo:
        if shared_prefill or c.spec.peer:
            groups.setdefault((s.sample_id, bool(c.spec.peer)), (s, []))[1].append(c)
        else:
            groups[(s.sample_id, c.key)] = (s, [c])
    return [unit(s, group) for s, group in groups.values()]
