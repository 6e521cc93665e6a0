"""Benchmark samples, the task-set registry, and sizing prompts to a token length.

This module imports no task set: each task-set module imports it and registers itself, and the
package's ``__init__`` imports them all, so the registry has no import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import DapqError
from ...prompts import encode_prompts


@dataclass(frozen=True)
class Sample:
    """One benchmark prompt with everything needed to run and score it."""

    taskset: str
    task: str
    sample_id: str
    prompt: str
    references: tuple[str, ...]
    metric: str
    answer_prefix: str = ""
    max_new_tokens: int = 32
    chat: bool = True
    meta: dict = field(default_factory=dict)
    metric_args: dict = field(default_factory=dict)
    context_end: int | None = None
    """Character offset in ``prompt`` where the context part ends and the question part begins:
    ``prompt[:context_end]`` is what ``--compress context`` compresses, ``prompt[context_end:]``
    the question that follows it uncompressed. None where a task has no separate question."""
    stop: tuple[str, ...] = ()
    """Stop strings: generation ends at the first one and the output is cut before it
    (HELMET's newline stopping)."""

    def __post_init__(self) -> None:
        if self.context_end is not None and not 0 < self.context_end <= len(self.prompt):
            raise ValueError(f"{self.sample_id}: context_end {self.context_end} outside the prompt")


@dataclass
class TaskArgs:
    """What the user asked for; each task set reads the fields it needs."""

    lengths: tuple[int, ...] = ()
    """Target prompt lengths (niah, ruler: default 4000) or the truncation length (longbench)."""
    samples: int = 2
    seed: int = 0
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    data: str | None = None
    tasks: tuple[str, ...] = ()
    haystack: str = "essays"
    max_context: int | None = None

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise DapqError(f"--samples must be >= 1, got {self.samples}")
        if any(n < 1 for n in self.lengths):
            raise DapqError(f"--lengths must be >= 1 token, got {', '.join(map(str, self.lengths))}")
        if any(not 0.0 <= d <= 1.0 for d in self.depths):
            # A depth is a fraction of the haystack: 1.5 would silently land at the end.
            raise DapqError(f"--depths must lie in [0, 1], got {', '.join(map(str, self.depths))}")


TASKSETS: dict[str, Callable[[object, TaskArgs], list[Sample]]] = {}


def taskset(name: str):
    """Register a task-set builder ``fn(tokenizer, args) -> list[Sample]``."""

    def deco(fn):
        TASKSETS[name] = fn
        return fn

    return deco


def build_samples(name: str, tokenizer, args: TaskArgs) -> list[Sample]:
    if name not in TASKSETS:
        raise DapqError(f"unknown task set {name!r}; choose from {', '.join(sorted(TASKSETS))}")
    if args.max_context is not None:
        for length in args.lengths:
            if length > args.max_context:
                raise DapqError(f"length {length} is longer than the model's context of {args.max_context}")
    samples = TASKSETS[name](tokenizer, args)
    if not samples:
        raise DapqError(f"task set {name!r} produced no samples (empty data files?)")
    return samples


def select_tasks(args: TaskArgs, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    """``--tasks`` (default: all ``known``), rejecting names the task set does not have."""
    tasks = args.tasks or known
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise DapqError(f"unknown {what} task(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    return tasks


def fill(template: str, context: str, **fields) -> tuple[str, int]:
    """``template`` with ``{context}`` and ``fields`` filled in, and the offset where the context ends.

    The offset is :attr:`Sample.context_end`: what ``--compress context`` compresses is the
    prompt up to it, the question part the rest.
    """
    before = template.partition("{context}")[0].format(**fields)
    return template.format(context=context, **fields), len(before) + len(context)


def fit_to_length(tokenizer, build: Callable[[int], tuple[str, str]], length: int, *, chat: bool = True) -> int:
    """Largest ``n`` such that the prompt ``build(n)`` encodes to at most ``length`` tokens.

    ``build(n)`` returns ``(prompt, answer_prefix, ...)`` with ``n`` units of filler (sentences,
    list items, distractor needles); what follows the first two items is the caller's. The real prompt is tokenised at every probe, chat template
    included, because BPE merges across unit boundaries make per-unit counts drift.
    """
    def size(n: int) -> int:
        prompt, prefix = build(n)[:2]
        return len(encode_prompts(tokenizer, [prompt], chat=chat, answer_prefix=prefix)[0])

    if size(0) > length:
        raise DapqError(f"a prompt of this task needs more than {length} tokens")
    lo, hi = 0, 1
    while size(hi) <= length:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if size(mid) <= length else (lo, mid)
    return lo
